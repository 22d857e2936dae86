"""The full values of large tensors, kept in the spool until the server asks for them.

A tensor of more than VALUES_MAX elements travels as hash, stats, sketch and sample: a
difference outside the sample could go unseen. So the run keeps each large tensor's
bytes here, compressed, one file per hash (`<spool>/.values/<hash>.z`); before an
upload the agent tells the server which hashes it holds, and the server asks for the
values of every hash it does not hold yet (`missing_values`). A hash's values are the
same bytes whoever measured them, so they travel once for the whole fleet, from the
first node that has them: a steady node sends nothing more. With both sides' values
every two answers that differ are compared element by element (design §2.8, "no blind
spots").

The store is bounded: after each run the files least recently written beyond
STORE_LIMIT bytes are deleted (a hash the server still wants is then sent by the next
run that produces it). The values the server asks for follow the run, each in parts
that fit the server's body limit (`_parts`); a server that predates parts takes at most
UPLOAD_BUDGET bytes of them in an upload, and the rest waits for the next one.
"""

from __future__ import annotations

import base64
import os
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from numparity_agent._log import log

STORE_LIMIT = 1 << 30  # bytes of compressed values kept in the spool
# Raw bytes of values in one document, for a server that predates parts (it takes 32 MiB).
UPLOAD_BUDGET = 16 << 20
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
             "int16": 2, "int32": 4, "int64": 8, "bool": 1}


def values_dir(spool_dir: Path) -> Path:
    # A dot folder: spooled() never takes it for a run document.
    return spool_dir / ".values"


def raw_size(entry: dict) -> int:
    """Bytes of a tensor entry's values, from its dtype and shape."""
    count = 1
    for d in entry.get("shape") or []:
        count *= int(d)
    return count * _ITEMSIZE.get(str(entry.get("dtype")), 8)


class ValuesStore:
    """Large tensors' little-endian bytes by hash, zlib-compressed, in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, digest: str) -> Path:
        return self.folder / f"{digest}.z"

    def keep(self, digest: str, raw: np.ndarray) -> None:
        """Keep the bytes of the tensor whose hash is ``digest`` (``raw``: its flat
        little-endian elements). A full disk only loses the chance to send them."""
        path = self._path(digest)
        try:
            if path.exists():
                os.utime(path)  # used again: the last to be pruned
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(zlib.compress(raw.view(np.uint8).data, 1))
            os.replace(tmp, path)
        except OSError as exc:
            log(f"could not keep the values of {digest[:12]} in {self.folder}: "
                f"{exc.strerror or exc}")

    def held(self, digests: Iterable[str]) -> list[str]:
        return [d for d in digests if self._path(d).is_file()]

    def raw(self, digest: str) -> bytes | None:
        """The kept values' little-endian bytes; None if gone or broken."""
        try:
            return zlib.decompress(self._path(digest).read_bytes())
        except (OSError, zlib.error):
            return None

    def wire(self, digest: str, dtype: str) -> dict[str, str] | None:
        """The wire form ``{"dtype", "data"}`` of the kept values; None if gone or broken."""
        raw = self.raw(digest)
        if raw is None:
            return None
        return {"dtype": dtype, "data": base64.b64encode(raw).decode("ascii")}

    def prune(self, limit: int = STORE_LIMIT) -> None:
        """Delete the least recently kept files beyond ``limit`` bytes."""
        try:
            files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.folder.glob("*.z")]
        except OSError:
            return
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= limit:
                break
            try:
                path.unlink()
                total -= size
            except OSError:
                pass
