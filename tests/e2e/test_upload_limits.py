"""Uploads that always fit (issue 28): a server with a small body limit takes a new
environment's full standard suite with every value.

A real agent runs the whole standard suite (every workload, every variant) with the
server out of reach, so its run document and the values of its large tensors wait in
the spool; `numparity-agent flush` then sends them to a live server whose body limit is
2 MiB (the document's JSON is ~5 MiB, the largest tensor's values 9 MiB). Nothing may be
refused or lost: every result is stored, every value the server asked for is held, and
a second node whose largest tensor differs in one element is compared on the whole
values in /compare. On today's main the document was refused with 413 and moved to
`rejected/`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.agent import clean_env, run_agent

from numparity_agent.testing import ValuesStore, spooled, values_dir

MIB = 1 << 20
LIMIT = 2 * MIB
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@pytest.fixture(scope="module")
def suite_spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real agent's full standard suite, spooled with its large tensors' values."""
    spool = tmp_path_factory.mktemp("suite") / "spool"
    done = run_agent("run", "--server", "http://127.0.0.1:9", "--max-wait", "0",
                     "--spool", str(spool), "--node", "small-limit", "--repeats", "1",
                     env=clean_env(NUMPARITY_TOKEN="unused"), timeout=900)
    assert done.returncode == 3, done.stderr  # spooled: the server was out of reach
    return spool


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMPARITY_MAX_BODY_BYTES", str(LIMIT))
    monkeypatch.setenv("NUMPARITY_TOKEN_BYTES_PER_S", "0")


@pytest.fixture
def server(small_limit: None, live_server: Any) -> Any:
    """A live server whose body limit is 2 MiB (the environment is set before it starts)."""
    return live_server


def _read(spool: Path) -> dict[str, Any]:
    (path,) = spooled(spool)
    return json.loads(path.read_bytes())


def _large(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["hash"]: t for r in document["results"] for t in r.get("tensors", [])
            if "dtype" in t and "values" not in t}


def _flush(server: Any, spool: Path) -> None:
    done = run_agent("flush", "--server", server.base_url, "--spool", str(spool),
                     env=clean_env(NUMPARITY_TOKEN=server.agent_token), timeout=600)
    assert done.returncode == 0, done.stderr
    assert spooled(spool) == [], done.stderr
    assert not (spool / "rejected").exists() or not any((spool / "rejected").iterdir())


def _kept(store: ValuesStore, digest: str) -> bytes:
    wire = store.wire(digest, "any")
    assert wire is not None
    return base64.b64decode(wire["data"])


def _perturbed_copy(source: Path, target: Path) -> dict[str, Any]:
    """A second node's spool: the suite's document with its largest tensor changed in
    one element (its values kept beside it, as `run` keeps them). Says where, and by
    how much."""
    document = _read(source)
    large = _large(document)
    digest = max(large, key=lambda h: math.prod(large[h]["shape"])
                 * ITEMSIZE[large[h]["dtype"]])
    entry = large[digest]
    assert entry["dtype"] == "float64" and math.prod(entry["shape"]) * 8 > 4 * LIMIT
    source_store, store = ValuesStore(values_dir(source)), ValuesStore(values_dir(target))
    values = np.frombuffer(_kept(source_store, digest), dtype="<f8").copy()
    middle = values.size // 2
    before = float(values[middle])
    values[middle] += 0.25
    # The tensor's hash as the wire contract defines it: sha256 of "dtype;dims;" + bytes.
    new = hashlib.sha256(f"float64;{','.join(map(str, entry['shape']))};".encode()
                         + values.tobytes()).hexdigest()
    document["run_id"] = str(uuid.uuid4())
    document["node"]["name"] = "small-limit-b"
    where: list[tuple[str, str, str]] = []
    for result in document["results"]:
        for tensor in result.get("tensors", []):
            if tensor["hash"] == digest:
                tensor["hash"] = new
                where.append((result["workload"], result["variant"], tensor["name"]))
    (workload, variant, name), = where
    target.mkdir()
    (target / spooled(source)[0].name).write_text(json.dumps(document))
    for held in source_store.held(large):
        if held != digest:
            store.keep(held, np.frombuffer(_kept(source_store, held), dtype=np.uint8))
    store.keep(new, values.view(np.uint8))
    return {"run_id": document["run_id"], "workload": workload, "variant": variant,
            "tensor": name, "changed": float(values[middle]) - before,
            "elements": values.size}


def test_a_small_body_limit_takes_a_new_environments_whole_suite_and_its_values(
        server: Any, suite_spool: Path, tmp_path: Path) -> None:
    document = _read(suite_spool)
    assert len(json.dumps(document)) > 2 * LIMIT  # the case: one body cannot carry it
    spool_a = tmp_path / "a"
    shutil.copytree(suite_spool, spool_a)
    other = _perturbed_copy(suite_spool, tmp_path / "b")
    _flush(server, spool_a)
    _flush(server, tmp_path / "b")

    headers = server.headers("reader")
    stored = httpx.get(f"{server.base_url}/api/v1/runs/{document['run_id']}",
                       headers=headers, timeout=30).json()
    assert sorted((r["workload"], r["variant"], r["device"], r["status"])
                  for r in stored["results"]) == sorted(
        (r["workload"], r["variant"], r["device"], r["status"]) for r in document["results"])
    # Every large tensor's whole values are held: the server wants none of them.
    large = sorted(_large(document))
    missing = httpx.post(f"{server.base_url}/api/v1/fingerprints/missing",
                         json={"values": large, "hashes": large},
                         headers=server.headers("agent"), timeout=30).json()
    assert missing["missing"] == [] and missing["missing_values"] == []
    assert missing["max_body_bytes"] == LIMIT

    compared = httpx.get(f"{server.base_url}/api/v1/compare", headers=headers, timeout=120,
                         params={"run_a": document["run_id"], "run_b": other["run_id"],
                                 "workload": other["workload"],
                                 "variant": other["variant"]}).json()
    (pair,) = compared["pairs"]
    differing = [row for row in pair["tensors"] if row["verdict"] != "identical"]
    assert [row["name"] for row in differing] == [other["tensor"]]
    (row,) = differing
    # Measured on the whole values, sent in parts: exactly the one changed element.
    assert row["basis"] == "values"
    assert row["metrics"]["max_abs"] == abs(other["changed"])
    assert row["metrics"]["mismatch_fraction"] == 1 / other["elements"]


@pytest.fixture
def budgeted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2 MiB body limit with the token byte budget at its default (1 MiB/s)."""
    monkeypatch.setenv("NUMPARITY_MAX_BODY_BYTES", str(LIMIT))
    monkeypatch.delenv("NUMPARITY_TOKEN_BYTES_PER_S", raising=False)
    monkeypatch.delenv("NUMPARITY_MAX_DOCUMENT_BYTES", raising=False)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_new_nodes_first_upload_is_paid_at_once_under_the_default_budget(
        budgeted: None, live_server: Any, suite_spool: Path, tmp_path: Path) -> None:
    """Issue 40 finding 7: the document decodes past the 2 MiB body limit; its decoded
    charge came on top of its parts', more than a 2 MiB bucket could ever hold, so every
    attempt was a 429 and the run stayed spooled for ever. The bucket holds what one
    upload may decode to: the whole first upload is paid at once, not one 429."""
    document = _read(suite_spool)
    spool = tmp_path / "spool"
    shutil.copytree(suite_spool, spool)
    done = run_agent("flush", "--server", live_server.base_url, "--spool", str(spool),
                     env=clean_env(NUMPARITY_TOKEN=live_server.agent_token), timeout=600)
    assert done.returncode == 0, done.stderr
    assert "HTTP 429" not in done.stderr
    assert spooled(spool) == []
    assert not (spool / "rejected").exists() or not any((spool / "rejected").iterdir())
    stored = httpx.get(f"{live_server.base_url}/api/v1/runs/{document['run_id']}",
                       headers=live_server.headers("reader"), timeout=30).json()
    assert len(stored["results"]) == len(document["results"])
    large = sorted(_large(document))
    missing = httpx.post(f"{live_server.base_url}/api/v1/fingerprints/missing",
                         json={"values": large, "hashes": large},
                         headers=live_server.headers("agent"), timeout=30).json()
    assert missing["missing"] == [] and missing["missing_values"] == []
