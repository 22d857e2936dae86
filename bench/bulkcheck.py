"""Check of bench/_bulk.py: a bulk-loaded fleet answers as the same fleet ingested through
HTTP, so bench/analysis.py measures a state a real lab can be in.

Not run by CI (it builds the synthetic lab with torch). Two temporary PostgreSQL
databases (or SQLite files) are loaded with the first ``--nodes`` nodes of the lab: one
by ``BulkLoader`` (exemplars through the real ingest, the other nodes as copies of their
rows), the other by ``POST /api/v1/runs`` of the app (FastAPI's TestClient: routes, body
limits, parsing and validation as an agent meets them), node by node in the order the
bulk loader gives ids, with the server's clock at each run's receipt as the bulk loader
sets it. Then ``/api/v1/audit`` and ``/api/v1/divergence`` (cnn/default, transformer/strict,
lstm/strict with ``tensor=output``) of both must be equal once parsed (a float to 1e-9:
the databases sum wall times in the order they read rows); every difference is printed
and makes the exit code 1.

    .venv/bin/python bench/bulkcheck.py [--nodes 600] [--answers 0] [--db postgresql|sqlite]
        [--postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _bulk import BulkLoader, shape
from _fleet import POLICY_TOML, Fleet, Loader
from analysis import postgres_database, sqlite_database
from fastapi.testclient import TestClient

from numparity_server.app import create_app
from numparity_server.auth.service import create_token
from numparity_server.kit.db import create_engine_for, session_factory
from numparity_server.kit.migrate import upgrade
from numparity_server.kit.settings import Settings
from numparity_server.models import utcnow
from numparity_server.runs import service as runs_service

QUESTIONS = (
    ("/api/v1/audit", {}),
    ("/api/v1/divergence", {"workload": "cnn", "variant": "default"}),
    ("/api/v1/divergence", {"workload": "transformer", "variant": "strict"}),
    ("/api/v1/divergence", {"workload": "lstm", "variant": "strict", "tensor": "output"}),
)


def ingest_order(fleet: Fleet, nodes: int) -> list[int]:
    """The nodes in the order the bulk loader stores them (and so numbers their rows):
    first those it ingests (each shape's first node, every faulty node), then the copies."""
    seen: set[Any] = set()
    real, copied = [], []
    for index in range(nodes):
        key = shape(fleet.node(index))
        if key is None or key not in seen:
            seen.add(key)
            real.append(index)
        else:
            copied.append(index)
    return real + copied


def http_load(client: TestClient, token: str, fleet: Fleet, order: list[int]) -> None:
    sent: set[str] = set()
    try:
        for index in order:
            for document, received in fleet.documents(fleet.node(index), sent):
                runs_service.utcnow = lambda received=received: received
                response = client.post("/api/v1/runs", json=document,
                                       headers={"Authorization": f"Bearer {token}"})
                if response.status_code != 201:
                    raise RuntimeError(f"{document['run_id']}: {response.status_code} "
                                       f"{response.text[:500]}")
    finally:
        runs_service.utcnow = utcnow


def token(url: str, role: str) -> str:
    engine = create_engine_for(Settings(database_url=url), pooled=False)
    try:
        with session_factory(engine)() as session:
            return create_token(session=session, role=role, label="bulkcheck").token
    finally:
        engine.dispose()


@contextmanager
def app(url: str, policy: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=url, policy_file=policy,
                                        token_bytes_per_s=0, read_cache_max_age_s=0))) as client:
        yield client


def answers(client: TestClient, reader: str) -> dict[str, Any]:
    found = {}
    for path, params in QUESTIONS:
        response = client.get(path, params=params, headers={"Authorization": f"Bearer {reader}"})
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} {params}: {response.status_code} {response.text}")
        found[f"{path} {params}"] = response.json()
    return found


def differences(a: Any, b: Any, where: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted((set(a) | set(b)) - {"generated_at"}):  # when each was asked
            if key not in a or key not in b:
                yield f"{where}.{key}: only in {'bulk' if key in a else 'http'}"
            else:
                yield from differences(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        # Sums of wall times: the database adds them in the order it reads the rows.
        if not math.isclose(a, b, rel_tol=1e-9):
            yield f"{where}: bulk {a} != http {b}"
    elif a != b:
        yield f"{where}: bulk {str(a)[:200]} != http {str(b)[:200]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=600)
    parser.add_argument("--answers", type=int, default=0)
    parser.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--postgres-url",
                        default=os.environ.get("NUMPARITY_TEST_DATABASE_URL",
                                               "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    fleet = Fleet(now=datetime.now(timezone.utc).replace(microsecond=0), answers=args.answers)
    with tempfile.TemporaryDirectory(prefix="numparity-bulkcheck-") as workdir, \
            ExitStack() as stack:
        policy = Path(workdir) / "policy.toml"
        policy.write_text(POLICY_TOML)
        urls = []
        for name in ("bulk", "http"):
            database = (postgres_database(args.postgres_url) if args.db == "postgresql"
                        else sqlite_database(Path(workdir) / name))
            if args.db == "sqlite":
                (Path(workdir) / name).mkdir()
            urls.append(stack.enter_context(database))
        bulk_url, http_url = urls
        for url in urls:
            upgrade(url)
        bulk = BulkLoader(Loader(fleet, bulk_url, processes=1))
        loaded = bulk.load(0, args.nodes)
        print(f"bulk: {loaded.nodes} nodes, {loaded.runs} runs in {loaded.seconds:.1f} s "
              f"({len(bulk.exemplars)} shapes)", flush=True)
        with app(http_url, policy) as client:
            http_load(client, token(http_url, "agent"), fleet, ingest_order(fleet, args.nodes))
            by_http = answers(client, token(http_url, "reader"))
        with app(bulk_url, policy) as client:
            by_bulk = answers(client, token(bulk_url, "reader"))
    found = list(differences(by_bulk, by_http))
    for line in found[:50]:
        print(line)
    summary = by_bulk["/api/v1/audit {}"]["summary"]
    print(f"{len(found)} difference(s) in {len(QUESTIONS)} answers; audit summary: {summary}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
