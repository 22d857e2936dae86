"""A fleet upgrading while a lab looks, on several `numparity-server serve` replicas of one
database: writers move nodes to new environments (a driver or torch upgrade: a new
environment and a new answer, upload after upload), spread over the replicas, while
readers ask every fleet-wide read of every replica. Used by
``tests/e2e/test_replicas.py`` and, longer, by ``bench/upgrade_reads.py``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from helpers.documents import audit_document

# Every fleet-wide read (each kept against the fleet's version, each several statements).
READS = {
    "divergence": "/api/v1/divergence?workload=cnn&variant=strict",
    "audit": "/api/v1/audit",
    "fleet page": "/",
    "workload page": "/workloads/cnn?tensor=output",
}


@dataclass
class Load:
    reads: Counter[tuple[str, int]] = field(default_factory=Counter)
    uploads: Counter[int] = field(default_factory=Counter)
    stored: list[str] = field(default_factory=list)  # run ids answered 201
    failures: list[str] = field(default_factory=list)  # what a failed request answered

    def failed_reads(self) -> int:
        return sum(n for (_route, status), n in self.reads.items() if not 200 <= status < 300)

    def read_error_rate(self) -> float:
        total = sum(self.reads.values())
        return self.failed_reads() / total if total else 0.0


def node_name(index: int) -> str:
    return f"node-{index:03d}"


def seed(urls: list[str], agent: dict[str, str], nodes: int) -> list[str]:
    """Every node's first run, under one environment."""
    stored = []
    with httpx.Client(timeout=60) as client:
        for index in range(nodes):
            document = audit_document(node_name(index), 3)
            response = client.post(f"{urls[index % len(urls)]}/api/v1/runs", json=document,
                                   headers=agent)
            assert response.status_code == 201, response.text
            stored.append(document["run_id"])
    return stored


def upgrade_while_reading(urls: list[str], agent: dict[str, str], reader: dict[str, str], *,
                          nodes: int, seconds: float, writers: int = 2, readers: int = 2,
                          max_uploads: int = 400) -> Load:
    """``writers`` threads move the nodes to new environments (each upload newer than the
    node's last) for ``seconds`` (at most ``max_uploads`` uploads in all), each upload to
    the next replica; ``readers`` threads ask every read of ``READS`` of every replica
    until the writers are done."""
    load = Load()
    lock = threading.Lock()
    writing_done = threading.Event()
    deadline = time.monotonic() + seconds
    counter = iter(range(max_uploads))

    def write(slot: int) -> None:
        with httpx.Client(timeout=60) as client:
            for step in counter:  # shared: at most max_uploads in all
                if time.monotonic() > deadline:
                    return
                node = node_name(step % nodes)
                # Newer than the seed (3 h ago) and than the node's previous upgrade.
                document = audit_document(node, 2.5 - step / 1000, shift=1e-3 * (step % 3),
                                          env_vars={"UPGRADE": str(step)})
                url = urls[(step + slot) % len(urls)]
                try:
                    response = client.post(f"{url}/api/v1/runs", json=document,
                                           headers=agent)
                    status = response.status_code
                except httpx.HTTPError as exc:
                    status, response = 0, None
                    detail = repr(exc)
                with lock:
                    load.uploads[status] += 1
                    if status == 201:
                        load.stored.append(document["run_id"])
                    else:
                        text = response.text[:300] if response is not None else detail
                        load.failures.append(f"POST {url} {node}: {status} {text}")

    def read(slot: int) -> None:
        with httpx.Client(timeout=60, headers=reader) as client:
            turn = slot
            while not writing_done.is_set():
                url = urls[turn % len(urls)]
                for route, path in READS.items():
                    try:
                        response = client.get(f"{url}{path}")
                        status = response.status_code
                        text = response.text[:300]
                    except httpx.HTTPError as exc:
                        status, text = 0, repr(exc)
                    with lock:
                        load.reads[(route, status)] += 1
                        if not 200 <= status < 300:
                            load.failures.append(f"GET {url}{path}: {status} {text}")
                turn += 1

    writer_threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    reader_threads = [threading.Thread(target=read, args=(k,)) for k in range(readers)]
    for thread in (*writer_threads, *reader_threads):
        thread.start()
    for thread in writer_threads:
        thread.join(seconds + 120)
    writing_done.set()
    for thread in reader_threads:
        thread.join(120)
    return load
