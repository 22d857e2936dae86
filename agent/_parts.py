"""What one request body cannot carry travels in parts (design §3.2, "uploads in parts").

The server says the largest body it takes (`max_body_bytes` in its answer to the
missing-question, and the `Numparity-Max-Body-Bytes` header of a 413). A run document
whose JSON would pass it goes as the parts of its gzip, named by their sha256, and the
server then stores the whole as the run; a large tensor's values, which the server asked
for, go in parts of their own after the run. Each part continues what the server holds:
its answer says how many bytes that is, so an interrupted upload resumes there, and a
part sent twice changes nothing. `Held` carries that across attempts: a retry starts at
the bytes the server held when the last attempt stopped, not at 0 again (which, under a
token's byte budget, would pay for the same part on every attempt).

A 413 without the header (a proxy's) halves the parts, down to PART_MIN; a 413 saying the
whole upload is over the server's own setting (`upload_too_large`) cannot be helped by
smaller parts: the answer goes back to the caller, which keeps the document in the spool.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from numparity_agent._answer import ServerAnswer, answer_of, no_answer

UPLOADS_PATH = "/api/v1/uploads"
VALUES_PATH = "/api/v1/values"
LIMIT_HEADER = "Numparity-Max-Body-Bytes"
# A part's bytes at most, whatever the server's limit: a part is sent well within the
# upload timeout on a slow link, and a failed one costs little to send again.
PART_MAX = 8 << 20
# Parts are not halved below this: a server (or proxy) refusing 4 KiB is not about size.
PART_MIN = 4 << 10
# A part refused with 409 (the server holds other bytes than the agent thought) is sent
# again from where the server says; this many times in a row at most.
RESYNCS = 3

# Upload (its URL, without the query) -> the most bytes of it the server said it held.
Held = dict[str, int]


@dataclass
class BodyLimit:
    """What this upload knows of the largest body the server takes: None until the server
    says (then it is the server's figure) or refuses a body as too large (then the largest
    body it took or half the refused one, whichever is known)."""

    bytes: int | None = None

    def learn(self, value: int | None) -> None:
        if value is not None and value > 0:
            self.bytes = value if self.bytes is None else min(self.bytes, value)

    def refused(self, response: httpx.Response, size: int) -> bool:
        """A 413 for a body of ``size`` bytes: lower the limit; False when it cannot go
        lower (the body was already PART_MIN or less)."""
        if size <= PART_MIN:
            return False
        announced = _int(response.headers.get(LIMIT_HEADER))
        lower = announced if announced is not None and announced < size else size // 2
        self.bytes = max(PART_MIN, lower if self.bytes is None else min(self.bytes, lower))
        return True

    @property
    def part(self) -> int:
        return min(PART_MAX, self.bytes) if self.bytes is not None else PART_MAX

    def fits(self, size: int) -> bool:
        return self.bytes is None or size <= self.bytes


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def too_large_for_parts(response: httpx.Response) -> bool:
    """The 413 says the whole upload is over the server's setting (not this body)."""
    try:
        return bool(response.json().get("error") == "upload_too_large")
    except (ValueError, AttributeError):
        return False


def send_parts(client: httpx.Client, url: Callable[[int], str], data: bytes,
               headers: dict[str, str], limit: BodyLimit, held: Held) -> ServerAnswer:
    """PUT ``data`` in parts to ``url(offset)`` until the server holds all of it; the
    last answer (2xx when it does). It starts where ``held`` says an earlier attempt
    left the server (a 409 puts it right) and records there how far the server got."""
    headers = {**headers, "Content-Type": "application/octet-stream"}
    upload = url(0).split("?", 1)[0]
    offset, resyncs = min(held.get(upload, 0), len(data)), 0
    if data and offset == len(data):
        # An earlier attempt got every byte there (its answer after them was a 429, say):
        # nothing to send, and an empty part would be refused. A server that dropped them
        # meanwhile says so at the next step (404), and the caller starts again.
        return ServerAnswer(200, f"{upload}: every byte held already")
    while True:
        chunk = data[offset:offset + limit.part]
        target = url(offset)
        try:
            response = client.put(target, content=chunk, headers=headers)
        except httpx.HTTPError as exc:
            return no_answer(target, exc)
        if response.status_code == 413 and not too_large_for_parts(response):
            if limit.refused(response, len(chunk)):
                continue
            return answer_of(response)
        there = _int(response.headers.get("Upload-Offset"))
        if response.status_code == 409 and there is not None and resyncs < RESYNCS:
            offset, resyncs = min(max(there, 0), len(data)), resyncs + 1
            continue
        if response.status_code != 200:
            return answer_of(response)
        try:
            state = response.json()
            received, complete = int(state["received"]), bool(state["complete"])
        except (ValueError, KeyError, TypeError):
            return ServerAnswer(response.status_code,
                                f"{target}: an answer that is not an upload's state")
        held[upload] = max(held.get(upload, 0), received)
        if complete:
            return answer_of(response)
        if received <= offset and chunk:
            resyncs += 1  # the server kept nothing of this part
            if resyncs > RESYNCS:
                return ServerAnswer(response.status_code,
                                    f"{target}: the server keeps none of the part sent")
        else:
            resyncs = 0
        offset = min(received, len(data))


def send_document_in_parts(client: httpx.Client, base: str, gzipped: bytes,
                           headers: dict[str, str], limit: BodyLimit, held: Held
                           ) -> ServerAnswer:
    """The gzip of a run document in parts, then stored as a run (POST .../run): the
    answer POST /runs would give (201, or 200 for a document already stored)."""
    digest = hashlib.sha256(gzipped).hexdigest()
    upload = f"{base}{UPLOADS_PATH}/{digest}"
    answer = ServerAnswer(None, "not sent")
    for _attempt in range(2):  # once more if the parts went meanwhile (a day untouched)
        answer = send_parts(client, lambda offset: f"{upload}?offset={offset}&total="
                                                   f"{len(gzipped)}",
                            gzipped, headers, limit, held)
        if not answer.ok:
            return answer
        try:
            response = client.post(f"{upload}/run", headers=headers)
        except httpx.HTTPError as exc:
            return no_answer(f"{upload}/run", exc)
        answer = answer_of(response)
        if response.status_code not in (404, 409) or _names_run_conflict(response):
            return answer
        # The server holds none (404: the parts went) or not all (409) of what this
        # agent believed it held: send them from the start (a 409 on the first part then
        # says where the server stands), never an empty part past the end.
        held.pop(upload, None)
    return answer


def _names_run_conflict(response: httpx.Response) -> bool:
    """A 409 about the run (another document under its run_id), not about the parts."""
    try:
        return bool(response.json().get("error") == "conflict")
    except (ValueError, AttributeError, json.JSONDecodeError):
        return False


def send_values(client: httpx.Client, base: str, digest: str, raw: bytes,
                headers: dict[str, str], limit: BodyLimit, held: Held) -> ServerAnswer:
    """A large tensor's values in parts; once complete the server checks them against
    the hash and keeps them."""
    return send_parts(client, lambda offset: f"{base}{VALUES_PATH}/{digest}?offset={offset}",
                      raw, headers, limit, held)
