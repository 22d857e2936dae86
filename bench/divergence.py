"""/divergence against the number of distinct answers: cold and warm, over HTTP.

Not run by CI. A lab where many driver/GPU/library combinations each give their own
bits: ``--nodes`` nodes, each with one ``cnn``/``default`` result (the suite's real cnn
shapes, fingerprinted by the agent's own code), whose answers fall into ``--answers``
classes. Half the nodes give answer 0 (the consensus), the others are spread evenly over
the rest; answer k scales the late layers by 1 + k·2.5e-7 (a few float32 ULP, so pairs
are partly equivalent, partly divergent) and has an environment of its own
(``env_vars.NUMPARITY_BENCH_ANSWER=k``), so each split is attributed. The fleet is
loaded in-process through the real ingest (``runs.service.ingest_run``; a new answer's
tensors travel once, then each node sends its manifest hash), then ``numparity-server
serve`` (one worker) answers, with a reader token:

- GET /api/v1/divergence?workload=cnn&variant=default (grouped by whole result)
- the same with ``tensor=output``
- each ``--param`` added (``--param pairs=all --param pairs_limit=50``)

``cold`` is the first request after loading (every comparison computed, unless an
earlier request of the same key stored it), ``warm`` the best of ``--repeats`` more.

    .venv/bin/python bench/divergence.py [--nodes 10000] [--answers 200]
        [--db sqlite|postgresql|both] [--repeats 3] [--param NAME=VALUE ...]
        [--postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import copy
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from analysis import postgres_database, reader_token, sqlite_database, vacuum_analyze
from ingest import WORKLOADS, running_server

from numparity_agent.testing import (
    build_document,
    capture_environment,
    compute_env_key,
    fingerprint,
    manifest_hash,
)
from numparity_server.kit.db import create_engine_for, session_factory
from numparity_server.kit.settings import Settings
from numparity_server.runs.service import ingest_run

STEP = 2.5e-7  # relative change per answer class: a couple of float32 ULP


def answer_of(index: int, answers: int) -> int:
    """Half the nodes give the consensus answer 0; the rest are spread over 1..answers-1."""
    if answers == 1 or index % 2 == 0:
        return 0
    return 1 + (index // 2) % (answers - 1)


def make_answers(answers: int) -> list[list[dict[str, Any]]]:
    """Each answer's cnn tensors: the first half of the layers shared, the rest scaled."""
    layers = WORKLOADS["cnn"]
    generator = torch.Generator().manual_seed(20261127)
    base = [torch.randn(shape, generator=generator) for _name, _kind, shape in layers]
    half = len(layers) // 2

    def entry(order: int, tensor: torch.Tensor) -> dict[str, Any]:
        name, kind, _shape = layers[order]
        return {"name": name, "kind": kind, "order": order, **fingerprint(tensor)}

    shared = [entry(order, base[order]) for order in range(half)]
    return [shared + [entry(order, base[order] * (1 + k * STEP))
                      for order in range(half, len(layers))] for k in range(answers)]


def load(url: str, nodes: int, answers: int) -> float:
    """The fleet, through the real ingest; the seconds it took."""
    tensors = make_answers(answers)
    environment = capture_environment()
    environment.pop("env_key", None)
    environments = []
    for k in range(answers):
        own = copy.deepcopy(environment)
        own["env_vars"] = {**own.get("env_vars", {}), "NUMPARITY_BENCH_ANSWER": str(k)}
        environments.append({"env_key": compute_env_key(own), **own})
    inputs = (secrets.token_hex(32), secrets.token_hex(32))
    sent: set[int] = set()
    engine = create_engine_for(Settings(database_url=url))
    sessions = session_factory(engine)
    began = time.monotonic()
    try:
        for index in range(nodes):
            k = answer_of(index, answers)
            result: dict[str, Any] = {
                "suite": "standard", "workload": "cnn", "workload_version": 1,
                "variant": "default", "device": "cpu", "status": "ok", "dtype": "float32",
                "input_hash": inputs[0], "param_hash": inputs[1], "repeats": 2,
                "repeats_agree": True, "wall_s": 0.05, "wall_s_repeats": [0.05, 0.05],
                "knobs": {}}
            if k in sent:
                result["manifest"] = manifest_hash(tensors[k])
            else:
                result["tensors"] = tensors[k]
                sent.add(k)
            document = build_document(
                node=f"node-{index:05d}", labels={}, environment=environments[k],
                results=[result], started_at="2026-11-21T10:00:00Z",
                finished_at="2026-11-21T10:00:41Z")
            with sessions() as session:
                ingest_run(session=session, document=document)
    finally:
        engine.dispose()
    return time.monotonic() - began


def timed(client: httpx.Client, params: dict[str, str], repeats: int
          ) -> tuple[float, float, int, dict[str, Any]]:
    """(cold ms, best warm ms, response bytes, answer)."""
    times = []
    response = None
    for _ in range(1 + repeats):
        began = time.perf_counter()
        response = client.get("/api/v1/divergence", params=params)
        times.append((time.perf_counter() - began) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{params}: {response.status_code} {response.text[:500]}")
    assert response is not None
    return times[0], min(times[1:] or times), len(response.content), response.json()


def scenario(db: str, url: str, args: argparse.Namespace, workdir: Path) -> list[str]:
    with running_server(url, 1, workdir / f"{db}.log") as server:
        seconds = load(url, args.nodes, args.answers)
        if db == "postgresql":
            vacuum_analyze(url)
        token = reader_token(url)
        print(f"  {db}: {args.nodes:,} nodes, {args.answers} answers loaded in "
              f"{seconds:.0f} s", flush=True)
        lines = []
        extra = dict(item.split("=", 1) for item in args.param)
        with httpx.Client(base_url=server.base_url, timeout=1800,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            for label, params in (("whole result", {}), ("tensor=output", {"tensor": "output"})):
                query = {"workload": "cnn", "variant": "default", **params, **extra}
                cold, warm, size, answer = timed(client, query, args.repeats)
                lines.append(f"{db:<11}{args.nodes:>8,}{args.answers:>8}  {label:<14}"
                             f"{cold:>10.0f}{warm:>10.0f}{size / 1024:>9.0f}"
                             f"{len(answer['groups']):>8}{len(answer['pairs']):>7}")
                print("  " + lines[-1], flush=True)
        return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3, help="warm requests after the first")
    parser.add_argument("--param", action="append", default=[],
                        help="another query parameter, NAME=VALUE (repeatable)")
    parser.add_argument("--postgres-url",
                        default=os.environ.get("NUMPARITY_TEST_DATABASE_URL",
                                               "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    if not 1 <= args.answers <= args.nodes:
        parser.error("--answers must be between 1 and --nodes")

    lines = []
    workdir = Path(tempfile.mkdtemp(prefix="numparity-bench-divergence-"))
    try:
        for db in ("sqlite", "postgresql"):
            if args.db not in (db, "both"):
                continue
            database = (sqlite_database(workdir) if db == "sqlite"
                        else postgres_database(args.postgres_url))
            with database as url:
                lines += scenario(db, url, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{'db':<11}{'nodes':>8}{'answers':>8}  {'grouped by':<14}{'cold ms':>10}"
          f"{'warm ms':>10}{'KiB':>9}{'groups':>8}{'pairs':>7}")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
