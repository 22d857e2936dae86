"""Hand-made fleets: groups, attribution, layers and the divergence report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from numparity_server.analysis import (
    Member,
    divergence_report,
    group_members,
    plan_divergence,
    rank_attributes,
    separating_attributes,
)

LAYERS = ("conv1", "conv2", "fc1")


def environment(*, threads: int = 2, cbwr: str | None = None, python: str = "3.11.7",
                host: str = "x") -> dict:
    env_vars = {"OMP_NUM_THREADS": str(threads)}
    if cbwr is not None:
        env_vars["MKL_CBWR"] = cbwr
    return {
        "env_key": f"key-{threads}-{cbwr}-{python}",
        "python": {"version": python},
        "cpu": {"model": "Xeon", "capability": "AVX512", "hostname": host},
        "threads": {"num_threads": threads, "num_interop_threads": 2},
        "torch": {"version": "2.13.0"},
        "env_vars": env_vars,
        "gpus": [],
        "unknown": {"gpus": "no NVML"},
    }


class Fleet:
    """Members whose tensors are real fingerprints of made-up activations."""

    def __init__(self, make_fingerprint, rng):
        self.make = make_fingerprint
        self.rng = rng
        self.fingerprints = {}
        self.members = []
        self.base = {name: rng.standard_normal(500).astype(np.float32)
                     for name in (*LAYERS, "output")}

    def variant(self, errors: dict[str, float]) -> tuple[tuple[str, str, str], ...]:
        """A manifest whose tensors carry these relative errors (0: the base bits)."""
        manifest = []
        for name in (*LAYERS, "output"):
            values = self.base[name]
            error = errors.get(name, 0.0)
            if math.isnan(error):
                values = values.copy()
                values[3] = np.nan
            elif error:
                noise = np.random.default_rng(int(error * 1e12) % 2**32).standard_normal(500)
                values = (values + error * noise * np.linalg.norm(values) / math.sqrt(500))
                values = values.astype(np.float32)
            fingerprint = self.make(values, name=name)
            self.fingerprints[fingerprint.hash] = fingerprint
            manifest.append((name, "output" if name == "output" else "layer", fingerprint.hash))
        return tuple(manifest)

    def add(self, node: str, env: dict, manifest) -> None:
        self.members.append(Member(node=node, run_id=f"run-{node}", env_key=env["env_key"],
                                   environment=env, tensors=manifest))


@pytest.fixture
def fleet(make_fingerprint, rng):
    return Fleet(make_fingerprint, rng)


def test_mkl_cbwr_split_is_named(fleet):
    unset = fleet.variant({})
    compatible = fleet.variant({"fc1": 1e-6, "output": 1e-5})
    for index, python in enumerate(["3.11.7", "3.11.8", "3.11.7"]):
        fleet.add(f"n{index}", environment(python=python, host=f"h{index}"), unset)
    for index, python in enumerate(["3.11.8", "3.11.7"], start=3):
        fleet.add(f"n{index}", environment(cbwr="COMPATIBLE", python=python, host=f"h{index}"),
                  compatible)
    groups, without = group_members(fleet.members, "output")
    assert [g.nodes for g in groups] == [["n0", "n1", "n2"], ["n3", "n4"]]
    assert without == []

    split = separating_attributes(groups[0], groups[1])
    assert split == [{"attribute": "env_vars.MKL_CBWR", "a": ["unset"], "b": ["COMPATIBLE"]}]

    ranking = rank_attributes(groups)
    assert ranking[0] == {"attribute": "env_vars.MKL_CBWR", "blob": False,
                          "distinct_values": 2, "conditional_entropy": 0.0, "purity": 1.0}
    python_row = next(r for r in ranking if r["attribute"] == "python.version")
    assert python_row["conditional_entropy"] > 0.9  # python says nothing about the group
    names = {r["attribute"] for r in ranking}
    assert "cpu.model" not in names  # constant across the fleet
    assert not any("hostname" in name or name.startswith("unknown") for name in names)


def test_thread_split_names_both_and_says_indistinguishable(fleet):
    one, two = fleet.variant({"output": 1e-6}), fleet.variant({})
    for index in range(3):
        fleet.add(f"a{index}", environment(threads=2, host=f"a{index}"), two)
    for index in range(2):
        fleet.add(f"b{index}", environment(threads=1, host=f"b{index}"), one)
    report = divergence_report(members=fleet.members, tensor="output",
                               fingerprints=fleet.fingerprints)
    (pair,) = report["pairs"]
    assert [row["attribute"] for row in pair["attribution"]] == [
        "env_vars.OMP_NUM_THREADS", "threads.num_threads"]
    assert pair["attribution"][1] == {"attribute": "threads.num_threads", "a": ["2"], "b": ["1"]}
    assert pair["indistinguishable"] is True
    top = [row["attribute"] for row in report["attribution"][:2]]
    assert sorted(top) == ["env_vars.OMP_NUM_THREADS", "threads.num_threads"]


def test_group_order_and_ids(fleet):
    first, second, third = fleet.variant({}), fleet.variant({"output": 1e-3}), fleet.variant(
        {"output": 1e-2})
    fleet.add("z1", environment(), first)
    fleet.add("m1", environment(threads=1), second)
    fleet.add("c1", environment(threads=3), third)
    fleet.add("c2", environment(threads=3), third)
    fleet.add("q1", environment(), ())  # no output at all
    groups, without = group_members(fleet.members, "output")
    assert [(g.id, g.nodes) for g in groups] == [(1, ["c1", "c2"]), (2, ["m1"]), (3, ["z1"])]
    assert without == ["q1"]


def test_first_divergent_layer_and_largest_jump(fleet):
    reference = fleet.variant({})
    drifted = fleet.variant({"conv2": 1e-6, "fc1": 1e-2, "output": 2e-2})
    fleet.add("ref", environment(), reference)
    fleet.add("ref2", environment(), reference)
    fleet.add("odd", environment(cbwr="AVX2"), drifted)
    report = divergence_report(members=fleet.members, tensor="output",
                               fingerprints=fleet.fingerprints)
    (pair,) = report["pairs"]
    layer = pair["first_divergent_layer"]
    assert (layer["name"], layer["order"], layer["basis"]) == ("conv2", 1, "values")
    assert layer["metrics"]["rel_l2"] == pytest.approx(1e-6, rel=0.3)
    assert layer["verdict"] in {"equivalent", "divergent"}
    jump = pair["largest_jump"]
    assert (jump["name"], jump["previous"], jump["metric"]) == ("fc1", "conv2", "rel_l2")
    assert jump["ratio"] == pytest.approx(1e4, rel=0.5)
    assert pair["verdict"] == "divergent"
    assert pair["metrics"]["rel_l2"] == pytest.approx(2e-2, rel=0.3)


def test_report_round_trips_through_strict_json_with_nan(fleet):
    clean, poisoned = fleet.variant({}), fleet.variant({"output": float("nan")})
    fleet.add("a", environment(), clean)
    fleet.add("b", environment(cbwr="COMPATIBLE"), poisoned)
    # Bits that differ only by the sign of a zero: equivalent, with an infinite SQNR.
    fleet.base["output"][0] = 0.0
    plus = fleet.variant({})
    fleet.base["output"][0] = -0.0
    minus = fleet.variant({})
    fleet.add("c", environment(threads=1), plus)
    fleet.add("d", environment(threads=3), minus)

    report = divergence_report(members=fleet.members, tensor="output",
                               fingerprints=fleet.fingerprints, pairs="all")
    text = json.dumps(report, allow_nan=False)
    assert json.loads(text) == report
    group_of = {g["nodes"][0]: g["id"] for g in report["groups"]}
    verdicts = {frozenset((p["a"], p["b"])): p for p in report["pairs"]}
    poisoned_pair = verdicts[frozenset((group_of["a"], group_of["b"]))]
    assert poisoned_pair["verdict"] == "nonfinite"
    zero_pair = verdicts[frozenset((group_of["c"], group_of["d"]))]
    assert zero_pair["verdict"] == "equivalent"
    assert zero_pair["metrics"]["sqnr_db"] is None  # infinite: no noise at all
    assert set(report) == {"tensor", "baseline", "groups", "pairs_mode", "pairs_total", "pairs",
                           "attribution", "members_without_tensor",
                           "members_without_tensor_total", "origin_note",
                           "nondeterministic_groups"}
    assert (report["pairs_mode"], report["pairs_total"], len(report["pairs"])) == ("all", 6, 6)
    group = report["groups"][0]
    assert set(group) == {"id", "hash", "size", "nodes", "nodes_total", "devices",
                          "devices_total", "env_keys", "env_keys_total", "representative",
                          "nondeterministic"}
    assert group["devices"] == []  # a CPU fleet: every member is its node's CPU
    assert group["representative"] == {"node": group["nodes"][0],
                                       "run_id": f"run-{group['nodes'][0]}", "device": "cpu"}


def test_fp64_judgement_per_group(make_fingerprint, rng):
    exact = rng.standard_normal(256)
    fp64 = make_fingerprint(exact, "float64")
    fp32 = make_fingerprint(exact.astype(np.float32))
    half = make_fingerprint(exact.astype(np.float16), "float16")
    brain = make_fingerprint(exact.astype(np.float32), "bfloat16")
    broken = make_fingerprint((exact + 0.5).astype(np.float32))
    with np.errstate(over="ignore"):
        overflow = make_fingerprint(exact * 1e5, "float16")  # some become inf
    groups = {"fp32": fp32, "half": half, "brain": brain, "broken": broken,
              "overflow": overflow}
    members = [Member(node, f"r-{node}", "k", environment(), (("output", "output", fp.hash),))
               for node, fp in groups.items()]
    report = divergence_report(
        members=members, tensor="output",
        fingerprints={fp.hash: fp for fp in groups.values()},
        reference=fp64, baseline=fp32,
    )
    verdicts = {g["nodes"][0]: g["fp64"]["acceptable"] for g in report["groups"]}
    assert verdicts == {"fp32": True, "half": True, "brain": True, "broken": False,
                        "overflow": False}
    json.dumps(report, allow_nan=False)


def test_one_group_has_nothing_to_explain(fleet):
    same = fleet.variant({})
    fleet.add("a", environment(threads=1), same)
    fleet.add("b", environment(threads=2), same)
    report = divergence_report(members=fleet.members, tensor="output",
                               fingerprints=fleet.fingerprints)
    assert [g["size"] for g in report["groups"]] == [2]
    assert report["pairs"] == [] and report["attribution"] == []
    empty = divergence_report(members=[], tensor="output", fingerprints={})
    assert empty == {"tensor": "output", "baseline": None, "groups": [],
                     "pairs_mode": "baseline", "pairs_total": 0, "pairs": [],
                     "attribution": [], "members_without_tensor": [],
                     "members_without_tensor_total": 0, "origin_note": None,
                     "nondeterministic_groups": []}


def test_a_version_is_named_before_a_blob_that_changed_with_it():
    """A torch upgrade changes torch.version and its 2 KB build config together: both
    separate the groups, the version reads first and the blob as the line that differs."""
    from numparity_server.analysis import Group

    config = "\n".join(f"  - build option {i}" for i in range(60))

    def env(version: str, build: str) -> dict:
        return {"env_key": f"key-{version}", "torch": {"version": version, "config": build}}

    old = Member(node="old", run_id="r1", env_key="key-2.12", environment=env("2.12.0", config))
    new = Member(node="new", run_id="r2", env_key="key-2.13",
                 environment=env("2.13.0", config.replace("option 7", "option 7 (cuda 12.8)")))
    groups = [Group(1, "h1", (old,)), Group(2, "h2", (new,))]
    found = separating_attributes(groups[0], groups[1])
    assert [item["attribute"] for item in found] == ["torch.version", "torch.config"]
    blob = found[1]
    assert (blob["a_short"], blob["b_short"]) == (
        "line 8: - build option 7", "line 8: - build option 7 (cuda 12.8)")
    assert blob["a"] == [env("2.12.0", config)["torch"]["config"]]  # the whole value kept
    ranked = rank_attributes(groups)
    assert [row["attribute"] for row in ranked] == ["torch.version", "torch.config"]


def test_the_full_matrix_comes_a_page_at_a_time(fleet):
    """Pairs i < j in order, any page of them, and their count: rows before the page are
    skipped by arithmetic (a far page does not walk the matrix)."""
    for k in range(6):
        fleet.add(f"n{k}", environment(threads=k + 1), fleet.variant({"output": k * 1e-3}))
    every = [(a, b) for a in range(1, 7) for b in range(a + 1, 7)]
    for offset in range(0, 17):
        for limit in (1, 4, 15, None):
            plan = plan_divergence(members=fleet.members, tensor="output", workload="cnn",
                                   policy_version="v", pairs="all", limit=limit,
                                   offset=offset)
            stop = None if limit is None else offset + limit
            assert [(p.a.id, p.b.id) for p in plan.pairs] == every[offset:stop]
            assert plan.pairs_total == 15
    far = plan_divergence(members=fleet.members, tensor="output", workload="cnn",
                          policy_version="v", pairs="all", limit=10, offset=10**9)
    assert far.pairs == [] and far.pairs_total == 15
    baseline = plan_divergence(members=fleet.members, tensor="output", workload="cnn",
                               policy_version="v")
    assert [(p.a.id, p.b.id) for p in baseline.pairs] == [(1, b) for b in range(2, 7)]
    # The key names the content: another policy version, another key; the same, the same.
    other = plan_divergence(members=fleet.members, tensor="output", workload="cnn",
                            policy_version="w")
    assert {p.key for p in baseline.pairs}.isdisjoint(p.key for p in other.pairs)
    assert [p.key for p in baseline.pairs] == [p.key for p in plan_divergence(
        members=fleet.members, tensor="output", workload="cnn", policy_version="v").pairs]
