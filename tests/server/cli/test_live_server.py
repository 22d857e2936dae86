"""A real uvicorn (`numparity-server serve`) on a loopback port: the live_server fixture."""

from __future__ import annotations

import gzip
import json

import httpx
from helpers.documents import run_document


def test_live_server_is_ready_and_ingests(live_server):
    ready = httpx.get(f"{live_server.base_url}/readyz", timeout=10)
    assert ready.status_code == 200

    document = run_document()
    response = httpx.post(
        f"{live_server.base_url}/api/v1/runs",
        content=gzip.compress(json.dumps(document).encode()),
        headers={**live_server.headers("agent"), "Content-Encoding": "gzip",
                 "Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    summary = httpx.get(f"{live_server.base_url}/api/v1/runs/{document['run_id']}",
                        headers=live_server.headers("reader"), timeout=10)
    assert summary.status_code == 200 and summary.json()["node"] == "node-1"
    denied = httpx.post(f"{live_server.base_url}/api/v1/runs", json=document,
                        headers=live_server.headers("reader"), timeout=10)
    assert denied.status_code == 403


def test_concurrent_uploads_sharing_fingerprints(live_server):
    """Nodes of one environment upload at once: every run lands, fingerprints once."""
    from concurrent.futures import ThreadPoolExecutor

    documents = [run_document(f"node-{i}", shift=1e-3 * (i % 2)) for i in range(8)]
    with httpx.Client(base_url=live_server.base_url, headers=live_server.headers("agent"),
                      timeout=60) as client, ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda d: client.post("/api/v1/runs", json=d).status_code,
                                 documents))
    assert statuses == [201] * 8
    report = httpx.get(f"{live_server.base_url}/api/v1/divergence",
                       params={"workload": "cnn", "variant": "default"},
                       headers=live_server.headers("reader"), timeout=30).json()
    assert sorted(g["size"] for g in report["groups"]) == [4, 4]
