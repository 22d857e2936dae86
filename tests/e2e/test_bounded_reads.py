"""A live server computing the worst read stops promptly on SIGTERM (issue 30, finding 1:
a server aligning two swapped 50,000-op traces ignored SIGTERM for minutes, while a
replacement bound the port). Two 20,000-op traces whose neighbours are swapped: the old
alignment took over a minute on them; now the read is bounded, and the server, told to
stop during it, ends within a few seconds."""

from __future__ import annotations

import gzip
import hashlib
import json
import signal
import threading
import time

import httpx
from helpers.documents import run_document

OPS = 20_000


def ref(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()[:16]


def swapped_trace(salt: str, swapped: bool) -> dict:
    order = [i ^ 1 for i in range(OPS)] if swapped else list(range(OPS))
    tensors = {ref("x"): ["float32", [8]]}
    ops = []
    for i in order:
        out = ref(f"{salt}-{i}")
        tensors[out] = ["float32", [8]]
        ops.append({"op": f"aten.op{i}.default", "module": f"m{i % 97}", "phase": "forward",
                    "in": [ref("x")], "out": [out]})
    body = {"format": "numparity.trace/v1", "hash_chars": 16, "tensors": tensors, "ops": ops}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {**body, "hash": hashlib.sha256(canonical.encode()).hexdigest()}


def test_sigterm_during_an_alignment_ends_the_server_within_seconds(live_server):
    runs = []
    for node, swapped, shift in (("node-a", False, 0.0), ("node-b", True, 1e-3)):
        body = swapped_trace(node, swapped)
        document = run_document(node, shift=shift)
        document["results"] = [document["results"][0]]
        document["results"][0]["trace"] = body["hash"]
        document["traces"] = [body]
        response = httpx.post(
            live_server.base_url + "/api/v1/runs", timeout=120,
            content=gzip.compress(json.dumps(document).encode()),
            headers={**live_server.headers("agent"), "Content-Type": "application/json",
                     "Content-Encoding": "gzip"})
        assert response.status_code == 201, response.text
        runs.append(document["run_id"])

    def read() -> None:
        try:
            httpx.get(live_server.base_url + "/api/v1/compare", timeout=120,
                      headers=live_server.headers(), params={"run_a": runs[0],
                                                             "run_b": runs[1]})
        except httpx.HTTPError:
            pass  # the server went away: what the test wants

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)  # the read is under way
    began = time.monotonic()
    live_server.process.send_signal(signal.SIGTERM)
    try:
        live_server.process.wait(timeout=30)
    finally:
        reader.join(120)
    # serve gives requests 3 s, then stops the computations: well within 15 s on any
    # machine this suite runs on (before: until the alignment ended, over a minute).
    assert time.monotonic() - began < 15, live_server.log()[-2000:]
