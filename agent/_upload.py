"""One exchange with the server: upload one run document, asking first.

Uploads ask first (design §3.2). The agent asks which of its results' manifests (the
ordered (name, kind, hash) lists) the server lacks; a result whose manifest it has
travels as that one hash. For the others it asks which fingerprints are missing, and
only those travel in full, the rest as bare references. Op traces (design §2.10) travel
likewise: a body only when the server lacks it. On a known environment a run is then a
few KiB. The spool always keeps the full document, so any server can take it.

Every answer becomes a ServerAnswer: what it means for the spooled document (delete,
retry later, keep for the operator, move aside) and whether to try again is decided in
`_flush`; the documents and the manifests memory live in `_spool`. The token is never
logged: it is masked in every log line (`_log.hide`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from numparity_agent._answer import (
    ServerAnswer,
    Verify,
    answer_of,
    no_answer,
    not_numparity,
    server_message,
)
from numparity_agent._log import log
from numparity_agent._parts import (
    BodyLimit,
    Held,
    send_document_in_parts,
    send_values,
    too_large_for_parts,
)
from numparity_agent._spool import KnownManifests
from numparity_agent._values import UPLOAD_BUDGET, ValuesStore, raw_size

DEFAULT_TIMEOUT_S = 30.0
RUNS_PATH = "/api/v1/runs"
MISSING_PATH = "/api/v1/fingerprints/missing"
# A tensor entry that refers to a fingerprint the server already has (design §2.7).
BARE_KEYS = ("name", "kind", "order", "hash")


def manifest_hash(tensors: list[dict[str, Any]]) -> str:
    """The server's manifest hash of a result's tensors: sha256 of the canonical JSON of
    the (name, kind, hash) triples in `order` (the form is part of the contract)."""
    ordered = sorted(enumerate(tensors), key=lambda it: (it[1]["order"], it[0]))
    triples = [[t["name"], t["kind"], t["hash"]] for _, t in ordered]
    canonical = json.dumps(triples, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _manifests(document: dict[str, Any]) -> dict[int, str]:
    """Result index -> manifest hash, for every result that has tensors."""
    return {i: manifest_hash(result["tensors"])
            for i, result in enumerate(document.get("results") or [])
            if result.get("tensors")}


def _traces(document: dict[str, Any]) -> list[str]:
    """The trace hashes the document's results refer to, first occurrence first, once."""
    return list(dict.fromkeys(
        result["trace"] for result in document.get("results") or []
        if isinstance(result, dict) and isinstance(result.get("trace"), str)))


def _tensor_hashes(document: dict[str, Any], only: set[int] | None = None) -> list[str]:
    """Every tensor hash of the document (of results `only`), first occurrence first, once."""
    hashes: dict[str, None] = {}
    for i, result in enumerate(document.get("results") or []):
        if only is not None and i not in only:
            continue
        for tensor in result.get("tensors") or []:
            if isinstance(tensor, dict) and isinstance(tensor.get("hash"), str):
                hashes.setdefault(tensor["hash"])
    return list(hashes)


def slim_document(
    document: dict[str, Any], missing: set[str], known_manifests: dict[int, str] | None = None,
    values: dict[str, dict[str, str]] | None = None, traces: set[str] | None = None,
) -> dict[str, Any]:
    """The document as it travels to a server that lacks only `missing` fingerprints
    (and only the `traces` bodies, when given: the others stay behind).

    A result in `known_manifests` (index -> manifest hash the server has) carries only
    that hash. Elsewhere the first tensor of each hash in `missing` travels in full and
    every other tensor as the bare reference {name, kind, order, hash}. `values` (hash
    -> wire values) are the full values of large tensors the server asked for: those
    tensors travel in full with them.
    """
    known_manifests = known_manifests or {}
    values = values or {}
    to_send = set(missing) | set(values)
    results = []
    for i, result in enumerate(document.get("results") or []):
        tensors = result.get("tensors")
        if i in known_manifests:
            slim_result = {k: v for k, v in result.items() if k != "tensors"}
            results.append({**slim_result, "manifest": known_manifests[i]})
            continue
        if not tensors:
            results.append(result)
            continue
        slim = []
        for tensor in tensors:
            digest = tensor.get("hash")
            if digest in to_send:
                to_send.discard(digest)
                slim.append({**tensor, "values": values[digest]} if digest in values
                            else tensor)
            else:
                slim.append({key: tensor[key] for key in BARE_KEYS if key in tensor})
        results.append({**result, "tensors": slim})
    slimmed = {**document, "results": results}
    if traces is not None and "traces" in document:
        bodies = [body for body in document["traces"]
                  if isinstance(body, dict) and body.get("hash") in traces]
        if bodies:
            slimmed["traces"] = bodies
        else:
            del slimmed["traces"]
    return slimmed


def _post(
    client: httpx.Client, url: str, gzipped: bytes, headers: dict[str, str]
) -> tuple[ServerAnswer, httpx.Response | None]:
    try:
        response = client.post(url, content=gzipped, headers=headers)
    except httpx.HTTPError as exc:
        return no_answer(url, exc), None
    return answer_of(response), response


@dataclass(frozen=True)
class _Missing:
    fingerprints: set[str]
    manifests: set[str]
    values: list[str] = field(default_factory=list)  # in the order they were offered
    traces: set[str] = field(default_factory=set)
    # The server's body limit; None from a server that predates uploads in parts.
    max_body_bytes: int | None = None


def _ask_missing(
    client: httpx.Client,
    base: str,
    headers: dict[str, str],
    *,
    hashes: Sequence[str] = (),
    manifests: Sequence[str] = (),
    values: Sequence[str] = (),
    traces: Sequence[str] = (),
) -> _Missing | ServerAnswer | None:
    """What the server lacks of these; None when it cannot tell us (an older server, or an
    error in this one question: send everything); a ServerAnswer when the upload cannot
    go on: the server is unreachable, unavailable or throttling (502/503/504, 408, 429: a
    full document would not help it) or refuses the token."""
    url = base + MISSING_PATH
    try:
        question: dict[str, list[str]] = {"hashes": list(hashes), "manifests": list(manifests)}
        if values:
            question["values"] = list(values)
        if traces:
            question["traces"] = list(traces)
        response = client.post(url, json=question, headers=headers)
    except httpx.HTTPError as exc:
        return no_answer(url, exc)
    if response.status_code != 200:
        answer = answer_of(response)
        unavailable = answer.status in (408, 429, 502, 503, 504)
        return answer if unavailable or answer.refused else None
    try:
        answer = response.json()
        missing = answer["missing"]
        # A server that predates manifest references does not answer for them: it has none.
        missing_manifests = answer.get("missing_manifests", manifests)
        # A server that predates full values never asks for them.
        missing_values = answer.get("missing_values", [])
        # One that predates op traces does not answer for them: it has none.
        missing_traces = answer.get("missing_traces", traces)
        limit = answer.get("max_body_bytes")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not all(isinstance(x, list | tuple)
               for x in (missing, missing_manifests, missing_values, missing_traces)):
        return None
    offered = set(values)
    return _Missing({h for h in missing if isinstance(h, str)},
                    {h for h in missing_manifests if isinstance(h, str)},
                    [h for h in missing_values if isinstance(h, str) and h in offered],
                    {h for h in missing_traces if isinstance(h, str)},
                    limit if isinstance(limit, int) and limit > 0 else None)


class _Exchange:
    """One upload's requests: the client, the server, the token's headers, what the
    server said of its body limit (a server that says takes uploads in parts) and how
    far earlier attempts got with the parts (`held`, kept by the caller)."""

    def __init__(self, client: httpx.Client, server: str, token: str | None,
                 held: Held | None = None) -> None:
        self.client = client
        self.base = server.rstrip("/")
        self.headers = _headers(token)
        self.auth = {k: v for k, v in self.headers.items() if k == "Authorization"}
        self.limit = BodyLimit()
        self.parts = False
        self.held: Held = {} if held is None else held

    def learn(self, answer: _Missing) -> None:
        if answer.max_body_bytes is not None:
            self.parts = True
            self.limit.learn(answer.max_body_bytes)

    def send(self, document: dict[str, Any], gzipped: bytes | None = None
             ) -> tuple[ServerAnswer, str]:
        """POST the document as a run, in parts when its JSON would pass the server's
        body limit (or the server refuses it as too large); the answer and its body. An
        answer that numparity's API cannot have given is marked misconfigured."""
        outcome, text = self._send(document, gzipped)
        return not_numparity(outcome, self.base + RUNS_PATH, expect="run_id"), text

    def _send(self, document: dict[str, Any], gzipped: bytes | None = None
              ) -> tuple[ServerAnswer, str]:
        raw = _dumps(document)
        if not self.parts or self.limit.fits(len(raw)):
            outcome, response = _post(self.client, self.base + RUNS_PATH,
                                      gzipped if gzipped is not None else _gzip(raw),
                                      self.headers)
            # A proxy's limit below the server's, say: the document goes in parts.
            split = (outcome.status == 413 and self.parts and response is not None
                     and not too_large_for_parts(response)
                     and self.limit.refused(response, len(raw)))
            if not split:
                return outcome, response.text if response is not None else ""
        outcome = send_document_in_parts(self.client, self.base, _gzip(raw), self.auth,
                                         self.limit, self.held)
        return outcome, outcome.detail

    def send_values(self, wanted: Sequence[str], large: dict[str, dict[str, Any]],
                    store: ValuesStore) -> ServerAnswer | None:
        """The values the server asked for, each in parts of its own. An answer worth
        retrying (or a refused token) stops them and is returned: the document stays in
        the spool and its next upload sends the rest. A tensor whose values the server
        will not take (not their hash's bytes, over its setting) is skipped, said."""
        for digest in wanted:
            raw = store.raw(digest) if digest in large else None
            if raw is None:
                continue
            answer = send_values(self.client, self.base, digest, raw, self.auth, self.limit,
                                 self.held)
            if answer.retry or answer.refused:
                return answer
            if not answer.ok:
                log(f"the server did not take the values of {digest[:12]}: HTTP "
                    f"{answer.status}, {server_message(answer.detail)}")
        return None

    def values_wanted(self, offered: list[str]) -> list[str] | ServerAnswer:
        """Of the large tensors' values offered, those the server wants (asked alone,
        after a run stored without asking)."""
        answer = _ask_missing(self.client, self.base, self.auth, values=offered)
        if isinstance(answer, ServerAnswer):
            return answer
        if answer is None:
            return []
        self.learn(answer)
        return answer.values if self.parts else []


def upload_document(
    document: dict[str, Any],
    *,
    server: str,
    token: str | None,
    timeout: float = DEFAULT_TIMEOUT_S,
    client: httpx.Client | None = None,
    gzipped_full: bytes | None = None,
    known: KnownManifests | None = None,
    verify: Verify = True,
    values: ValuesStore | None = None,
    held: Held | None = None,
) -> ServerAnswer:
    """Upload a run document, sending only what the server lacks (design §3.2).

    Results whose manifest the server has travel as its hash: those in `known` (what
    this agent saw the server store) without asking, the others after asking. Of the
    rest, full fingerprints go only for the missing hashes, bare references for the
    others. A 422 naming a hash we referenced (retention dropped it meanwhile) is retried
    once by asking, then with the full document; a server without the question
    (404/405) gets the full document. `gzipped_full` is the full document already
    gzip-compressed, when the caller has it. `verify` is for the client made here (a
    given `client` has its own). `values` holds large tensors' full values: the server is
    told which it holds, and those it asks for follow the run in parts of their own
    (`_parts`; a server that predates them takes them in the document, `_values`).
    Nothing is sent in a body the server said it would refuse: a document too large
    for one goes in parts. `held`, kept by a caller that retries, is how far earlier
    attempts got with the parts: they resume there, and it grows as the server takes more.
    """
    if client is None:
        with httpx.Client(timeout=timeout, verify=verify) as own:
            return upload_document(document, server=server, token=token, client=own,
                                   gzipped_full=gzipped_full, known=known, values=values,
                                   held=held)
    exchange = _Exchange(client, server, token, held)
    manifests = _manifests(document)
    traces = _traces(document)
    stored = set(manifests.values()) | set(traces)  # a server that took this run has these
    if known is not None and manifests and all(digest in known for digest in stored):
        outcome, text = exchange.send(slim_document(document, set(), manifests, traces=set()))
        if outcome.ok:
            return _values_after(exchange, document, values) or outcome
        if not (outcome.status == 413
                or outcome.status == 422 and _names_a_bare_hash(text, stored)):
            return outcome
        known.forget()  # the server forgot some (or its limit changed): ask from now on
    outcome = _upload_asking(document, manifests, exchange, gzipped_full=gzipped_full,
                             values=values)
    if outcome.ok and known is not None:
        known.remember(sorted(stored))
    return outcome


def _values_after(exchange: _Exchange, document: dict[str, Any],
                  store: ValuesStore | None) -> ServerAnswer | None:
    """After a run stored without asking: the values the server wants of its large
    tensors, sent; None, or the answer that stopped them."""
    large = _large_tensors(document)
    offered = store.held(large) if store is not None else []
    if store is None or not offered:
        return None
    wanted = exchange.values_wanted(offered)
    if isinstance(wanted, ServerAnswer):
        return wanted if wanted.retry or wanted.refused else None
    return exchange.send_values(wanted, large, store)


def _upload_asking(
    document: dict[str, Any],
    manifests: dict[int, str],
    exchange: _Exchange,
    *,
    gzipped_full: bytes | None,
    values: ValuesStore | None = None,
) -> ServerAnswer:
    base, auth = exchange.base, exchange.auth

    def full() -> ServerAnswer:
        return exchange.send(document, gzipped_full)[0]

    if not manifests:
        return full()
    large = _large_tensors(document)
    offered = values.held(large) if values is not None else []
    traces = _traces(document)
    answer = _ask_missing(exchange.client, base, auth,
                          manifests=sorted(set(manifests.values())), values=offered,
                          traces=traces)
    if isinstance(answer, ServerAnswer):
        return answer
    if answer is None:  # a server that cannot tell: send everything
        return full()
    exchange.learn(answer)
    missing_traces = answer.traces & set(traces)
    # A server that takes values in parts gets them after the run; an older one in it.
    wanted_values = answer.values if exchange.parts else []
    sent_values = {} if exchange.parts else _values_to_send(answer.values, large, values)
    known_manifests = {i: digest for i, digest in manifests.items()
                       if digest not in answer.manifests}
    # A result with values to send travels with its tensors, not as its manifest.
    for i, result in enumerate(document.get("results") or []):
        if i in known_manifests and set(_tensor_hashes({"results": [result]})) & set(sent_values):
            del known_manifests[i]
    hashes = _tensor_hashes(document, only=set(manifests) - set(known_manifests))
    missing: set[str] = set()
    if hashes:
        answer = _ask_missing(exchange.client, base, auth, hashes=hashes)
        if isinstance(answer, ServerAnswer):
            return answer
        missing = set(hashes) if answer is None else answer.fingerprints
    if (not known_manifests and not sent_values and missing.issuperset(hashes)
            and missing_traces.issuperset(traces)):
        outcome = full()
    else:
        outcome, text = exchange.send(slim_document(document, missing, known_manifests,
                                                    sent_values, traces=missing_traces))
        referenced = ((set(hashes) - missing) | set(known_manifests.values())
                      | (set(traces) - missing_traces))
        if outcome.status == 422 and _names_a_bare_hash(text, referenced):
            # Retention dropped what we referenced between the question and the upload.
            outcome = full()
    if outcome.ok and wanted_values and values is not None:
        return exchange.send_values(wanted_values, large, values) or outcome
    return outcome


def _large_tensors(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Hash -> entry of every tensor that travels without its values (too large)."""
    found: dict[str, dict[str, Any]] = {}
    for result in document.get("results") or []:
        for tensor in result.get("tensors") or []:
            if (isinstance(tensor, dict) and "values" not in tensor and "dtype" in tensor
                    and isinstance(tensor.get("hash"), str)):
                found.setdefault(tensor["hash"], tensor)
    return found


def _values_to_send(wanted: Sequence[str], large: dict[str, dict[str, Any]],
                    store: ValuesStore | None) -> dict[str, dict[str, str]]:
    """For a server that predates uploads in parts: the wire values of the wanted hashes,
    in the server's order, up to UPLOAD_BUDGET raw bytes; the server asks for the rest
    next time. A tensor whose values alone pass the budget never goes (a document
    carrying it would be refused as too large; a newer server takes it in parts)."""
    sent: dict[str, dict[str, str]] = {}
    budget = UPLOAD_BUDGET
    for digest in wanted:
        entry = large.get(digest)
        if store is None or entry is None:
            continue
        size = raw_size(entry)
        if size > budget:
            continue
        wire = store.wire(digest, str(entry["dtype"]))
        if wire is not None:
            sent[digest] = wire
            budget -= size
    return sent


def _names_a_bare_hash(text: str, bare: set[str]) -> bool:
    return any(match in bare for match in _HASH.findall(text))


_HASH = re.compile(r"[0-9a-f]{64}")


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _gzip(body: bytes) -> bytes:
    # Level 6: nearly level 9's ratio on JSON with base64 at a fraction of the time.
    # mtime 0: the same document gzips to the same bytes, so an upload in parts (named
    # by the gzip's sha256) resumes where the last attempt stopped instead of anew.
    return gzip.compress(body, compresslevel=6, mtime=0)
