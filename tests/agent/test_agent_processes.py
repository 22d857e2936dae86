"""Variants that set nothing process-wide share one child per device (design §2.3): the
same bits as in children of their own, a crash or a hang still costs only the variant
it hit, and the document's timeline says where each child's time went."""

from __future__ import annotations

import json

import pytest
from helpers.agent import run_agent

SHARED = ["default", "fp16-autocast", "bf16-autocast"]


def _run(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = run_agent("run", *args, "--repeats", "1", "--output", str(out), timeout=300)
    assert out.exists(), proc.stderr
    return json.loads(out.read_text())


def _hashes(document: dict) -> dict[tuple[str, str], list[tuple[str, str]]]:
    return {(r["workload"], r["variant"]): [(t["name"], t["hash"]) for t in r["tensors"]]
            for r in document["results"] if r["status"] == "ok"}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared")
    return _run(tmp, "shared", "--workloads", "mlp", "transformer", "--variants",
                *SHARED, "strict")


def test_variants_without_process_wide_settings_share_a_child(shared):
    children = [(t["device"], t["variants"]) for t in shared["timeline"]]
    assert children == [("cpu", SHARED), ("cpu", ["strict"])]
    # The results keep the order the run asked for.
    assert [r["variant"] for r in shared["results"]] == [
        v for v in [*SHARED, "strict"] for _ in ("mlp", "transformer")]


def test_a_shared_child_computes_the_bits_of_children_of_their_own(shared, tmp_path):
    alone = {}
    for name in ("bf16-autocast", "fp16-autocast"):
        alone.update(_hashes(_run(tmp_path, name, "--workloads", "mlp", "transformer",
                                  "--variants", name)))
    together = _hashes(shared)
    assert alone and all(together[key] == alone[key] for key in alone)


def test_the_timeline_accounts_for_each_child(shared):
    for child in shared["timeline"]:
        phases = child["phases"]
        assert {"start_s", "import_s", "build_s", "run_s", "fingerprint_s", "write_s",
                "other_s"} <= set(phases)
        assert sum(phases.values()) == pytest.approx(child["wall_s"], abs=0.05)
        mine = [r for r in shared["results"] if r["variant"] in child["variants"]]
        assert phases["run_s"] == pytest.approx(
            sum(r["timeline"]["run_s"] for r in mine), abs=1e-3)
    # The environment is captured once, by the first child.
    first, second = shared["timeline"]
    assert "environment_s" in first["phases"] and "environment_s" not in second["phases"]


def test_a_crash_in_a_shared_child_fails_only_its_variant(tmp_path):
    document = _run(tmp_path, "crash", "--workloads",
                    "agent_test_workloads:crash_in_fp16_autocast", "--variants", *SHARED)
    status = {r["variant"]: r for r in document["results"]}
    assert status["default"]["status"] == "ok"
    assert status["fp16-autocast"]["status"] == "failed"
    assert "SIGABRT" in status["fp16-autocast"]["error"]
    # The variant after the crash ran in a fresh child.
    assert status["bf16-autocast"]["status"] == "ok"
    assert [t["variants"] for t in document["timeline"]] == [
        ["default", "fp16-autocast"], ["bf16-autocast"]]


def test_a_hang_in_a_shared_child_times_out_only_its_variant(tmp_path):
    document = _run(tmp_path, "hang", "--workloads",
                    "agent_test_workloads:hang_in_fp16_autocast", "--variants", *SHARED,
                    "--timeout", "40")
    status = {r["variant"]: r for r in document["results"]}
    assert status["default"]["status"] == "ok"
    assert status["fp16-autocast"]["status"] == "failed"
    assert "fp16-autocast timed out after 40 s" in status["fp16-autocast"]["error"]
    assert status["bf16-autocast"]["status"] == "ok"
