"""LLM-era numerics end to end (design §2.2, §3.3.12-13): real agents run the `decoder`
and `invariance` workloads on three simulated nodes — two stock, one whose PyTorch never
picks the flash attention backend (tests/helpers/sdpa_math: its sitecustomize turns it
off, as a site's startup code might) — and upload through `flush` to a real uvicorn,
on SQLite and on PostgreSQL, with a policy that requires the decoder to be batch-invariant.

What this CPU does is read from the uploaded documents' own fingerprints, never assumed:
a check holds exactly when the two tensors it compares have the same hash (the
fingerprint covers dtype, shape and every bit). Against that oracle:

- `/audit`'s numerics table says, per environment, whether the decoder and the probe are
  batch-invariant (naming the op), whether decode equals prefill and whether the
  attention backends agree;
- the policy lists every node whose decoder is not batch-invariant;
- `/divergence` on the decoder splits the math-attention node from its stock peers, and
  attribution names the knob.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.agent import clean_env
from helpers.e2e import upload_with_agent

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
NODES = {"stock-1": [], "stock-2": [], "sdpa-math": [HELPERS / "sdpa_math"]}


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("llm")
    found = {}
    for node, paths in NODES.items():
        env = clean_env()
        env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env["PYTHONPATH"]])
        path = out / f"{node}.json"
        done = subprocess.run(
            [sys.executable, "-m", "numparity_agent", "run", "--node", node, "--workloads",
             "decoder", "invariance", "--variants", "default", "--repeats", "1",
             "--output", str(path)],
            env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        found[node] = path
    return found


@pytest.fixture
def policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy the live server starts with (requested before it)."""
    path = tmp_path / "policy.toml"
    path.write_text('[required]\n"decoder.batch_invariant" = true\n')
    monkeypatch.setenv("NUMPARITY_POLICY_FILE", str(path))


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _hashes(document: dict[str, Any], workload: str) -> dict[str, str]:
    result = next(r for r in document["results"] if r["workload"] == workload)
    return {t["name"]: t["hash"] for t in result["tensors"]}


def oracle(document: dict[str, Any]) -> dict[str, tuple[bool, str | None]]:
    """What each audit column must say of a node, from its fingerprints alone."""
    probe, decoder = _hashes(document, "invariance"), _hashes(document, "decoder")
    ops = [name.removesuffix(".b1") for name in probe if name.endswith(".b1")]  # in order
    breaking = [op for op in ops
                if any(probe[name] != probe[f"{op}.b1"] for name in probe
                       if name.startswith(f"{op}.b") and name != f"{op}.b1")]
    batch = decoder["batch.alone"] == decoder["batch.batched"]
    backends = [name for name in decoder if name.startswith("sdpa.") and name != "sdpa.math"]
    disagree = [name.removeprefix("sdpa.") for name in backends
                if decoder[name] != decoder["sdpa.math"]]
    return {
        "batch_invariant": (not breaking and batch,
                            f"invariance: {breaking[0]}" if breaking else None),
        "decode_equals_prefill": (decoder["decode.logits"] == decoder["output"], None),
        "attention_backends_agree": (not disagree,
                                     f"decoder: {disagree[0]}" if disagree else None),
    }


def get(server: Any, path: str, **params: str) -> Any:
    answer = httpx.get(f"{server.base_url}/api/v1/{path}", params=params,
                       headers=server.headers("reader"), timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_numerics_are_reported_judged_by_policy_and_split_by_backend(
        documents, policy, live_server, tmp_path):
    upload_with_agent(list(documents.values()), live_server, tmp_path / "spool")
    loaded = {node: _load(path) for node, path in documents.items()}
    env_of = {node: d["environment"]["env_key"] for node, d in loaded.items()}
    assert env_of["stock-1"] == env_of["stock-2"] != env_of["sdpa-math"]
    assert loaded["sdpa-math"]["environment"]["knobs"]["cuda.flash_sdp_enabled"] is False

    audit = get(live_server, "audit")
    rows = {row["env_key"]: row for row in audit["numerics"] if row["variant"] == "default"}
    assert set(rows) == set(env_of.values())
    for node in ("stock-1", "sdpa-math"):
        row = rows[env_of[node]]
        for column, (holds, op) in oracle(loaded[node]).items():
            assert row[column] is holds, (node, column, row)
            if op is not None:
                assert row[f"{column}_op"] == op, (node, column, row)
    stock = rows[env_of["stock-1"]]
    assert stock["devices"] == 2
    if not stock["batch_invariant"]:
        # Every break is listed with how far and where; the probe's op comes first.
        first = stock["breaks"][0]
        assert first["check"] == "batch_invariant" and first["devices"] == 2
        assert first["max_ulp"] is None or first["max_ulp"] > 0

    # The policy: every node whose decoder is not batch-invariant here, and only those.
    decoder_breaks = {node for node, d in loaded.items()
                      if _hashes(d, "decoder")["batch.alone"]
                      != _hashes(d, "decoder")["batch.batched"]}
    violators = {row["node"] for row in audit["policy"]
                 if row["attribute"] == "decoder.batch_invariant"}
    assert violators == decoder_breaks
    assert audit["summary"]["policy_violations"] == len(decoder_breaks)
    for row in audit["policy"]:
        assert row["value"].startswith("false under default") and row["expected"] == ["true"]

    # /divergence on the decoder: the math node apart from its stock peers, when its
    # bits differ here, and the knob named.
    stock_hashes = _hashes(loaded["stock-1"], "decoder")
    if _hashes(loaded["sdpa-math"], "decoder") == stock_hashes:
        pytest.skip("turning flash attention off changes no bit of the decoder on this CPU")
    report = get(live_server, "divergence", workload="decoder", variant="default")
    group = {node: g["id"] for g in report["groups"] for node in g["nodes"]}
    assert group["stock-1"] == group["stock-2"] != group["sdpa-math"]
    (split,) = [p for p in report["pairs"]
                if {p["a"], p["b"]} == {group["stock-1"], group["sdpa-math"]}]
    attributes = {item["attribute"]: item for item in split["attribution"]}
    assert "knobs.cuda.flash_sdp_enabled" in attributes, list(attributes)
    item = attributes["knobs.cuda.flash_sdp_enabled"]
    math_side = item["a"] if split["a"] == group["sdpa-math"] else item["b"]
    assert math_side == ["false"]
