"""What "no blind spots" costs a node: keeping and sending large tensors' whole values.

Not run by CI.

    .venv/bin/python bench/values.py [--variants default strict] [--workloads ...]

1. Runs the suite in process twice, without and with keeping the values
   (`run_suite(values_dir=...)`), and prints the wall time of each (a ratio: the
   machine is noisy), the large tensors, their raw bytes and the store's bytes on disk.
2. Uploads with the agent's own `upload_document` (the spool's store offered) to a
   real server app on a temporary SQLite file, counting every request body:
   - node A, the first with its answers: its values travel once;
   - node B, the same answers: the values A's per-upload budget left, then none (its
     question still offers the hashes);
   - node A again with its spool's memory of the manifests (the hourly steady state);
   - node C with MKL_CBWR=COMPATIBLE (a real divergence on most x86 CPUs): the values
     of its differing tensors travel once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from numparity_agent.testing import (
    KnownManifests,
    ValuesStore,
    raw_size,
    run_suite,
    upload_document,
)
from numparity_server.app import create_app
from numparity_server.auth import service as auth_service
from numparity_server.kit import migrate
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.settings import Settings


class Counted:
    """Request body bytes, and how many tensors carried values, per upload."""

    def __init__(self) -> None:
        self.bytes = 0
        self.values = 0

    def __call__(self, request: httpx.Request) -> None:
        self.bytes += len(request.content)


def run(variants: list[str], workloads: list[str] | None, folder: Path | None
        ) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    document = run_suite(variants=variants, workloads=workloads, repeats=1,
                         values_dir=folder, log_line=lambda _line: None)
    return document, time.perf_counter() - started


def upload(client: TestClient, token: str, document: dict[str, Any], store: ValuesStore,
           known: KnownManifests | None = None) -> tuple[int, int]:
    counted = Counted()
    client.event_hooks["request"] = [counted]
    outcome = upload_document(document, server=str(client.base_url), token=token,
                              client=client, values=store, known=known)
    assert outcome.ok, outcome
    return counted.bytes, outcome.status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["default", "strict"])
    parser.add_argument("--workloads", nargs="+", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="numparity-values-bench-"))
    store_a = ValuesStore(tmp / "a" / ".values")

    _plain, plain_s = run(args.variants, args.workloads, None)
    doc_a, kept_s = run(args.variants, args.workloads, store_a.folder)
    large = {t["hash"]: t for r in doc_a["results"] for t in r.get("tensors", [])
             if "values" not in t}
    on_disk = sum(p.stat().st_size for p in store_a.folder.glob("*.z"))
    print(f"suite ({', '.join(args.variants)}): {plain_s:.1f} s plain, {kept_s:.1f} s keeping "
          f"values ({kept_s / plain_s:.2f}x)")
    print(f"large tensors: {len(large)} distinct, {sum(map(raw_size, large.values())) / 2**20:.1f}"
          f" MiB raw, {on_disk / 2**20:.1f} MiB in the store (zlib level 1)")

    url = f"sqlite:///{tmp / 'server.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url)
    with session_factory(get_engine(settings))() as session:
        token = auth_service.create_token(session=session, role="agent", label="bench").token
    with TestClient(create_app(settings)) as client:
        sent, _ = upload(client, token, doc_a, store_a)
        print(f"node A, first with these answers: {sent / 2**10:,.0f} KiB sent (values once)")
        doc_b = json.loads(json.dumps(doc_a))
        doc_b["run_id"] = doc_b["run_id"][:-4] + "bbbb"
        doc_b["node"]["name"] = "node-b"
        store_b = ValuesStore(tmp / "b" / ".values")
        for digest in store_a.held(large):
            (store_b.folder).mkdir(parents=True, exist_ok=True)
            (store_b.folder / f"{digest}.z").write_bytes((store_a.folder / f"{digest}.z")
                                                         .read_bytes())
        sent, _ = upload(client, token, doc_b, store_b)
        print(f"node B, same answers, asks first: {sent / 2**10:,.0f} KiB sent (the values "
              "A's 16 MiB budget left, if any)")
        sent, _ = upload(client, token, {**doc_b, "run_id": doc_b["run_id"][:-4] + "bbb2"},
                         store_b)
        print(f"node B again, asks first: {sent / 2**10:,.0f} KiB sent (no values)")
        known = KnownManifests(None, str(client.base_url))
        known.remember(sorted({m for m in _manifests(doc_a)}))
        doc_a2 = json.loads(json.dumps(doc_a))
        doc_a2["run_id"] = doc_a2["run_id"][:-4] + "aaa2"
        sent, _ = upload(client, token, doc_a2, store_a, known)
        print(f"node A an hour later (known manifests): {sent / 2**10:,.1f} KiB sent")

        os.environ["MKL_CBWR"] = "COMPATIBLE"
        store_c = ValuesStore(tmp / "c" / ".values")
        doc_c, _ = run(args.variants, args.workloads, store_c.folder)
        doc_c["node"]["name"] = "node-c"
        new = {t["hash"] for r in doc_c["results"] for t in r.get("tensors", [])
               if "values" not in t} - set(large)
        sent, _ = upload(client, token, doc_c, store_c)
        print(f"node C, MKL_CBWR=COMPATIBLE: {len(new)} large tensors differ; "
              f"{sent / 2**20:.2f} MiB sent (their values, once)")


def _manifests(document: dict[str, Any]) -> list[str]:
    from numparity_agent.testing import manifest_hash

    return [manifest_hash(r["tensors"]) for r in document["results"] if r.get("tensors")]


if __name__ == "__main__":
    sys.exit(main())
