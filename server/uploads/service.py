"""Uploads in parts (design §3.2): what one request body cannot carry arrives in parts.

An agent sends a run document whose JSON would pass ``max_body_bytes`` as the parts of
its gzip, named by their sha256, and then asks for the whole to be ingested as a run;
it sends a large tensor's values (the server asked for them) in parts named by the
tensor's hash, after the run holding the tensor. Each part continues the bytes the
server holds (the answer says how many, so an agent resumes where it stopped, and a
part sent twice changes nothing); a part that starts past them is a 409 naming the
offset to continue from. The whole is checked against its name when it is complete:
a document's sha256, a tensor's hash over ``dtype;dims;bytes``, so no node can store
other bytes under a name.

What a token holds unfinished is bounded (twice ``max_values_bytes``; its least
recently written uploads make room for a new part; a token's parts arriving at once take
turns on its row, so the bound holds under concurrency) and parts untouched for a day
are dropped when an upload begins and by retention (design §3.7).
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from numparity_server.analysis.tensor_stats import ValuesStats
from numparity_server.kit.db import writing
from numparity_server.kit.errors import (
    Conflict,
    InvalidDocument,
    NotFound,
    StagingFull,
    UploadOffset,
    UploadTooLarge,
)
from numparity_server.models import utcnow
from numparity_server.runs.schemas import ITEMSIZE
from numparity_server.uploads import repository
from numparity_server.uploads.schemas import UploadState

DOCUMENT = "document"
VALUES = "values"
STALE_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class Limits:
    """The settings that bound uploads in parts."""

    max_document_bytes: int
    max_values_bytes: int

    @property
    def staged_per_token(self) -> int:
        return 2 * self.max_values_bytes


def put_part(*, session: Session, token_id: int, kind: str, digest: str, offset: int,
             total: int, data: bytes, limits: Limits) -> UploadState:
    """Add ``data`` (bytes ``offset``.. of the upload) to what the token holds of it."""
    largest = limits.max_document_bytes if kind == DOCUMENT else limits.max_values_bytes
    if total > largest:
        setting = ("NUMPARITY_MAX_DOCUMENT_BYTES" if kind == DOCUMENT
                   else "NUMPARITY_MAX_VALUES_BYTES")
        raise UploadTooLarge(f"the {kind} {digest} has {total} bytes, more than the "
                             f"{largest} this server takes (setting {setting})")
    if not data:
        raise InvalidDocument.at(["body"], "a part holds at least one byte")
    if offset + len(data) > total:
        raise InvalidDocument.at(["query", "offset"], f"a part of {len(data)} bytes at "
                                                      f"offset {offset} ends past the "
                                                      f"upload's {total} bytes")
    try:
        with writing(session):
            return _add(session, token_id=token_id, kind=kind, digest=digest, offset=offset,
                        total=total, data=data, limits=limits)
    except IntegrityError:
        # The same part arrived twice at once: the other request stored it.
        return state_of(session=session, token_id=token_id, kind=kind, digest=digest,
                        total=total)


def _add(session: Session, *, token_id: int, kind: str, digest: str, offset: int,
         total: int, data: bytes, limits: Limits) -> UploadState:
    # Parts of one token arriving at once take turns: each reads what the token holds
    # after the one before wrote (96-152 MiB were staged against 64 MiB without).
    repository.lock_token(session, token_id)
    held = repository.parts(session, token_id=token_id, kind=kind, digest=digest)
    if held and held[0].total != total:
        raise Conflict(f"the upload {digest} was begun with {held[0].total} bytes in all, "
                       f"not {total}")
    received = sum(part.size for part in held)
    if offset > received:
        raise UploadOffset(f"the server holds bytes 0..{received} of {digest}: the next part "
                           f"starts at offset {received}, not {offset}", received=received)
    tail = data[received - offset:]  # what the server holds already is not stored again
    if tail:
        now = utcnow()
        if not held:
            repository.delete_stale(session, before=now - STALE_AFTER)
        _make_room(session, token_id=token_id, need=len(tail), keep=(kind, digest),
                   limit=limits.staged_per_token)
        repository.insert_part(session, {
            "token_id": token_id, "kind": kind, "digest": digest, "offset": received,
            "size": len(tail), "total": total, "data": tail, "received_at": now})
        received += len(tail)
    return UploadState(digest=digest, kind=kind, total=total, received=received,
                       complete=received == total)


def _make_room(session: Session, *, token_id: int, need: int, keep: tuple[str, str],
               limit: int) -> None:
    """Drop the token's least recently written other uploads until ``need`` more bytes
    fit its bound (an agent sends one upload at a time: the others were abandoned, or
    belong to a node sharing the token, which then starts them again)."""
    staged = repository.staged(session, token_id)
    held = sum(upload.size for upload in staged)
    for upload in staged:
        if held + need <= limit:
            break
        if (upload.kind, upload.digest) == keep:
            continue
        repository.delete_upload(session, token_id=token_id, kind=upload.kind,
                                 digest=upload.digest)
        held -= upload.size
    if held + need > limit:
        raise StagingFull(f"this token holds {held} bytes of unfinished uploads; "
                          f"{need} more would pass its bound of {limit}: retry later")


def state_of(*, session: Session, token_id: int, kind: str, digest: str,
             total: int) -> UploadState:
    held = repository.parts(session, token_id=token_id, kind=kind, digest=digest)
    received = sum(part.size for part in held)
    return UploadState(digest=digest, kind=kind, total=total, received=received,
                       complete=received == total)


def assembled_document(*, session: Session, token_id: int, digest: str) -> bytes:
    """The whole of a document uploaded in parts, checked against its sha256 (a whole
    that is not is dropped: a 422, and the agent sends it again)."""
    held = repository.parts(session, token_id=token_id, kind=DOCUMENT, digest=digest)
    if not held:
        raise NotFound(f"no upload {digest} from this token: send its parts first "
                       "(PUT /api/v1/uploads/{sha256})")
    received, total = sum(part.size for part in held), held[0].total
    if received < total:
        raise UploadOffset(f"the upload {digest} is incomplete: the server holds {received} "
                           f"of its {total} bytes", received=received)
    whole = b"".join(repository.part_bytes(session, held))
    if hashlib.sha256(whole).hexdigest() != digest:
        drop(session=session, token_id=token_id, kind=DOCUMENT, digest=digest)
        raise InvalidDocument.at(["path", "sha256"], f"the parts' sha256 is not {digest}: "
                                                     "they are dropped, send them again")
    return whole


def drop(*, session: Session, token_id: int, kind: str, digest: str) -> None:
    with writing(session):
        repository.delete_upload(session, token_id=token_id, kind=kind, digest=digest)


def put_values_part(*, session: Session, token_id: int, digest: str, offset: int,
                    data: bytes, limits: Limits) -> UploadState:
    """A part of the values of the stored tensor ``digest``; when they are complete they
    are checked against the hash and become the fingerprint's values."""
    target = repository.values_target(session, digest)
    if target is None:
        raise NotFound(f"no fingerprint {digest}: its values follow the run that holds it")
    if target.dtype not in ITEMSIZE:
        raise InvalidDocument.at(["path", "hash"], f"a {target.dtype} tensor has no values")
    total = math.prod(target.shape) * ITEMSIZE[target.dtype]
    if target.held:  # sent by another node meanwhile, or this one's retry
        return UploadState(digest=digest, kind=VALUES, total=total, received=total,
                           complete=True)
    state = put_part(session=session, token_id=token_id, kind=VALUES, digest=digest,
                     offset=offset, total=total, data=data, limits=limits)
    if state.complete:
        _store_values(session, token_id=token_id, digest=digest, dtype=target.dtype,
                      shape=target.shape)
    return state


def _store_values(session: Session, *, token_id: int, digest: str, dtype: str,
                  shape: list[int]) -> None:
    """Check the complete values against the hash (the agent's sha256 over
    ``dtype;dims;bytes``) and store them compressed; either way the parts go.

    The parts are read one at a time and hashed, compressed and counted as they come
    (``ValuesStats``: bounded chunks), before any write: what this holds is the
    compressed values and one part, never the whole raw values and their float64 copies
    (a 64 MiB float16 tensor took 1.3 GiB), and the write lock (SQLite's, which every
    upload waits for) is held only to store the result."""
    held = repository.parts(session, token_id=token_id, kind=VALUES, digest=digest)
    check = hashlib.sha256(f"{dtype};{','.join(map(str, shape))};".encode())
    # zlib at its fastest level, as ingest stores the values it receives.
    compressor = zlib.compressobj(1)
    # Grown in place (no list of pieces joined at the end: twice its size at once).
    values = bytearray()
    stats = ValuesStats(dtype)
    for data in repository.part_bytes(session, held):
        check.update(data)
        values += compressor.compress(data)
        stats.add(data)
        del data
    values += compressor.flush()
    session.rollback()  # the read ends here: nothing is held while the result is stored
    matches = check.hexdigest() == digest
    if not matches:
        target = repository.values_target(session, digest)
        if target is not None and target.held:
            return  # another request completed the same parts while these were read
    with writing(session):
        repository.delete_upload(session, token_id=token_id, kind=VALUES, digest=digest)
        if matches:
            # The statistics the values give replace those the first uploader declared
            # (design §3.1: what the server can compute, it computes).
            repository.fill_values(session, digest=digest, values=values, dtype=dtype,
                                   codec="zlib", stats=stats.result())
    if not matches:
        raise InvalidDocument.at(["path", "hash"], f"the values' sha256 is not the tensor's "
                                                   f"hash {digest} (values of other bytes): "
                                                   "their parts are dropped")
