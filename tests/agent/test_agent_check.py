"""`numparity-agent check` (design §2.12): its exit code per cause, fail-open, its budget,
the comparison naming the first tensor that differs, and what it sends the server.

The causes that need no computation run the real CLI against a live server (a closed
port, a wrong token, an environment the server never saw, a budget too small). Those of a
device (differs, failed, several devices at once) run `main` with the node's listing and
the variant children replaced at the edge, against a live server holding a real fleet's
answers."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from helpers.agent import clean_env, run_agent
from helpers.documents import audit_document, environment

from numparity_agent import _check, _cli, _suite
from numparity_agent._upload import manifest_hash

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


# ---- the comparison -------------------------------------------------------------------


def tensors(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"name": name, "kind": "layer", "order": i, "hash": digest}
            for i, (name, digest) in enumerate(pairs)]


EXPECTED_TENSORS = tensors(("conv1", "a" * 64), ("pool2", "b" * 64), ("output", "c" * 64))
EXPECTED = {"workload": "cnn", "workload_version": 1, "variant": "strict", "source": "pin",
            "manifest_hash": manifest_hash(EXPECTED_TENSORS), "input_hash": "i" * 64,
            "param_hash": "p" * 64,
            "tensors": [(t["name"], t["hash"][:16]) for t in EXPECTED_TENSORS]}


def result(**fields: Any) -> dict[str, Any]:
    return {"workload": "cnn", "variant": "strict", "status": "ok", "workload_version": 1,
            "input_hash": "i" * 64, "param_hash": "p" * 64, "tensors": EXPECTED_TENSORS,
            **fields}


@pytest.mark.parametrize(("fields", "status", "first", "says"), [
    ({}, "match", None, ""),
    ({"tensors": tensors(("conv1", "a" * 64), ("pool2", "d" * 64), ("output", "e" * 64))},
     "differs", "pool2", "from tensor pool2 on"),
    ({"tensors": tensors(("conv1", "a" * 64), ("output", "c" * 64))}, "differs", "pool2",
     "no tensor pool2"),
    ({"input_hash": "j" * 64}, "differs", None, "broken inputs"),
    ({"workload_version": 2}, "unchecked", None, "workload version 2 here, 1 in the pin"),
    ({"status": "skipped", "reason": "needs a GPU"}, "unchecked", None, "needs a GPU"),
    ({"status": "failed", "error": "RuntimeError: CUDA error: an illegal memory access"},
     "failed", None, "illegal memory access"),
    ({"status": "failed", "error": "variant strict timed out after 3 s (child killed)"},
     "timeout", None, "deadline"),
])
def test_a_result_against_the_expected_answer(fields: dict[str, Any], status: str,
                                              first: str | None, says: str) -> None:
    verdict = _check.compare(EXPECTED, result(**fields), _check.KeyVerdict("cnn", "strict",
                                                                          "pin"))
    assert (verdict.status, verdict.first_differing) == (status, first)
    assert says in verdict.detail


def test_the_node_cause_and_fail_open() -> None:
    def device(*statuses: str) -> _check.DeviceVerdict:
        return _check.DeviceVerdict("cpu", None, None, "cpu", keys=[
            _check.KeyVerdict("cnn", "strict", "pin", status) for status in statuses])

    assert device("match", "unchecked").code == 0
    assert device("match", "differs").code == 10
    assert device("match", "failed").code == 13
    assert device("match", "timeout").code == 14
    assert device("unchecked").code == device().code == 11
    assert _check.worst([0, 11, 13, 10]) == 10 and _check.worst([12, 14]) == 14
    for code, open_code in ((10, 10), (13, 13), (11, 0), (12, 0), (14, 0), (5, 0)):
        report = _check.CheckReport(devices=[], fail_open=True, cause_code=code)
        assert report.exit_code == open_code
        assert _check.CheckReport(devices=[], fail_open=False,
                                  cause_code=code).exit_code == code


def test_the_plan_is_data_the_agent_validates_never_code_it_runs() -> None:
    """Issue 39, finding 3: the server's plan holds what any node uploaded. Only the
    suite's workloads, `module:factory` names this node's settings allow, and known
    variants are run; every other entry is unchecked with the reason, never a crash."""
    entries = [
        EXPECTED,
        {**EXPECTED, "workload": "tempfile:mkdtemp"},
        {**EXPECTED, "workload": "os:abort"},
        {**EXPECTED, "variant": "no-such-variant"},
        {**EXPECTED, "workload": "lab.models:build"},
        {**EXPECTED, "tensors": [[1, 2]]},
        {**EXPECTED, "workload_version": "1"},
        {"workload": 7, "variant": "strict"},
        "not an entry",
    ]
    runnable, refused = _check.allowed_plan(entries, suite="standard",
                                            allowed=frozenset({"lab.models:build"}))
    assert [a["workload"] for a in runnable] == ["cnn", "lab.models:build"]
    assert all(k.status == "unchecked" for k in refused) and len(refused) == 7
    reasons = {(k.workload, k.variant): k.detail for k in refused}
    assert "not a workload of suite standard" in reasons[("tempfile:mkdtemp", "strict")]
    assert "not run" in reasons[("os:abort", "strict")]
    assert "not a variant this agent knows" in reasons[("cnn", "no-such-variant")]
    assert "no answer to compare with" in reasons[("cnn", "strict")]
    assert _check.allowed_plan("not a list", suite="standard", allowed=frozenset()) == \
        ([], [])
    # The large suite's own workloads are not the standard suite's.
    assert _check.allowed_plan([{**EXPECTED, "workload": "gemm"}], suite="standard",
                               allowed=frozenset())[0] == []
    # Keys the server cannot decide are shown with its reason.
    (undecided,) = _check.undecided_keys([{"workload": "cnn", "variant": "strict",
                                           "note": "split without a majority"}, 5])
    assert (undecided.status, undecided.detail) == ("unchecked", "split without a majority")


def test_a_drilled_device_is_never_a_go_it_did_not_earn() -> None:
    """Issue 39, finding 1: a drill whose corrupted variant was not compared cannot tell,
    and --fail-open never turns a drill's 'cannot tell' into a go."""
    keys = [_check.KeyVerdict("cnn", "default", "fleet", "match"),
            _check.KeyVerdict("cnn", "strict", "fleet", "unchecked", "split")]
    drilled = _check.DeviceVerdict("cpu", None, None, "cpu", keys=keys, drilled=True)
    assert drilled.code == 11 and "drilled variant strict was not compared" in drilled.line()
    assert _check.DeviceVerdict("cpu", None, None, "cpu", keys=keys).code == 0
    report = _check.CheckReport(devices=[drilled], fail_open=True, cause_code=11,
                                drill=True)
    assert report.exit_code == 11 and report.verdict == "unknown"
    assert _check.CheckReport(devices=[], fail_open=True, cause_code=11).exit_code == 0


def test_device_models_and_stacks_are_the_servers() -> None:
    # The server's own code is the oracle; where only the agent is installed, skip.
    devices = pytest.importorskip("numparity_server.runs.devices", reason="the server's "
                                  "packages are not installed (pip install '.[server]')")
    service = pytest.importorskip("numparity_server.runs.service")
    SeenDevice, promoted_columns = devices.SeenDevice, service.promoted_columns
    for device in ({"type": "cpu", "name": "AMD EPYC 7B13"},
                   {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"},
                   {"type": "cuda", "name": "NVIDIA A100 MIG 1g.10gb", "compute_capability":
                    "8.0", "mig": True}):
        seen = SeenDevice(slot="x", type=device["type"], uuid=None, serial=None,
                          pci_bus_id=None, name=device["name"],
                          compute_capability=device.get("compute_capability"),
                          mig=bool(device.get("mig")))
        assert _check.device_model(device) == seen.model
    env = environment()
    env["gpus"] = [{"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0",
                    "driver": "550.54.15"}]
    env["torch"]["cuda"] = "12.4"
    server = {k: v for k, v in promoted_columns(env).items() if v is not None}
    assert _check.stack_of(env) == server


# ---- causes through the real CLI -------------------------------------------------------


def cli_check(server_url: str, token: str, *args: str, budget: float = 60
              ) -> tuple[Any, float]:
    started = time.monotonic()
    done = run_agent("check", "--server", server_url, "--max-seconds", str(budget), *args,
                     env={**clean_env(), "NUMPARITY_TOKEN": token}, timeout=budget + 30)
    return done, time.monotonic() - started


@SQLITE
def test_causes_that_need_no_computation(live_server: Any) -> None:
    # The server has no run: nothing to compare with.
    done, _ = cli_check(live_server.base_url, live_server.agent_token, "--json")
    assert done.returncode == 11, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["cause"], report["devices"][0]["verdict"]) == ("unknown_environment",
                                                                   "unknown")
    assert "knows no run" in report["devices"][0]["note"]
    done, _ = cli_check(live_server.base_url, live_server.agent_token, "--fail-open")
    assert done.returncode == 0 and "go (fail-open)" in done.stderr
    # A token the server refuses.
    done, _ = cli_check(live_server.base_url, "np_not-a-token")
    assert done.returncode == 5, done.stderr
    assert "refused the token" in done.stderr and "np_not-a-token" not in done.stderr
    # Nobody listening: 12, or 0 with --fail-open (NUMPARITY_CHECK_FAIL=open alike).
    closed = "http://127.0.0.1:9"
    done, _ = cli_check(closed, "np_x")
    assert done.returncode == 12 and "unreachable" in done.stderr
    env = {**clean_env(), "NUMPARITY_TOKEN": "np_x", "NUMPARITY_CHECK_FAIL": "open"}
    done = run_agent("check", "--server", closed, env=env, timeout=90)
    assert done.returncode == 0 and "exit 12 without --fail-open" in done.stderr
    done = run_agent("check", "--server", closed, "--fail-closed", env=env, timeout=90)
    assert done.returncode == 12


def test_the_budget_is_never_exceeded() -> None:
    # Listing the node (a child importing torch) does not fit in 2.5 s with the
    # interpreter's start: the check stops at its budget, wherever it was.
    # The agent's clock counts from its process's start, and it can act on its deadline
    # only once its interpreter is up: on a loaded machine (two test workers, each with
    # torch children) that start alone can take seconds. So the allowance is the start
    # measured just before (`--help`: the interpreter and the CLI's imports), never a
    # fixed guess of this machine's speed.
    started = time.monotonic()
    assert run_agent("--help", env=clean_env(), timeout=120).returncode == 0
    interpreter = time.monotonic() - started
    done, seconds = cli_check("http://127.0.0.1:9", "np_x", "--json", budget=2.5)
    assert done.returncode == 14, done.stderr
    assert "not finished within --max-seconds" in done.stderr
    assert json.loads(done.stdout)["seconds"] <= 2.5 + interpreter
    assert seconds < 2.5 + interpreter + 5


def test_usage_errors() -> None:
    for args, says in ((("--max-seconds", "0"), "--max-seconds"),
                       (("--variants", "nope"), "unknown variant"),
                       (("--drill-device", "cpu"), "--fault-drill"),
                       ((), "check needs --server")):
        server = () if not args else ("--server", "http://127.0.0.1:9")
        done = run_agent("check", *server, *args, timeout=60)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr


# ---- a device's causes, the children replaced at the edge -------------------------------


@pytest.fixture
def fleet_node(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A live server holding three nodes' answers on one environment; this process plays a
    fourth node of it with two CPUs' worth of devices (the listing replaced)."""
    import httpx

    documents = [audit_document(f"peer-{i}", 1) for i in (1, 2, 3)]
    for document in documents:
        response = httpx.post(f"{live_server.base_url}/api/v1/runs", json=document,
                              headers=live_server.headers("agent"), timeout=60)
        assert response.status_code == 201, response.text
    devices = [{"device": f"cuda:{i}", "type": "cuda", "name": "fake", "uuid": f"GPU-{i}",
                "compute_capability": "9.0"} for i in range(2)]
    answers = {r["variant"]: r for r in documents[0]["results"] if r["status"] == "ok"}

    def listing(_selection: str, _deadline: Any) -> tuple[Any, Any, float]:
        return devices, documents[0]["environment"], 0.5

    monkeypatch.setattr(_check, "list_node", listing)
    monkeypatch.setenv("NUMPARITY_TOKEN", live_server.agent_token)
    return {"server": live_server, "answers": answers, "devices": devices}


def _model_cpu(device: Any) -> str:
    return "cpu"  # the fleet's answers are a CPU's: both devices are compared with them


@SQLITE
def test_every_device_at_once_one_verdict_each_naming_the_tensor(fleet_node: dict[str, Any],
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_check, "device_model", _model_cpu)
    calls: list[tuple[str, str, float]] = []

    def child(variant: str, *, workloads: list[str], device: str, timeout: float,
              fault_drill: bool = False, **_: Any) -> tuple[None, list[dict[str, Any]]]:
        calls.append((device, variant, timeout))
        time.sleep(0.5)
        found = dict(fleet_node["answers"][variant], device=device)
        if device == "cuda:1" and variant == "strict":
            return None, [{**found, "status": "failed", "error": "child killed by signal "
                           "SIGSEGV"}]
        return None, [found]

    monkeypatch.setattr(_suite, "run_variant", child)
    started = time.monotonic()
    code = _cli.main(["check", "--server", fleet_node["server"].base_url])
    elapsed = time.monotonic() - started
    out = capsys.readouterr()
    assert code == 13, out.err
    lines = dict(line.split(" ", 1) for line in out.out.splitlines())
    assert ": go — 2 of 2 answer(s) as the fleet's majority" in lines["cuda:0"]
    assert "NO-GO — cnn/strict failed: child killed by signal SIGSEGV" in lines["cuda:1"]
    # strict first on each device, both devices at once (0.5 s a child, 4 children).
    assert [v for d, v, _t in calls if d == "cuda:0"] == ["strict", "default"]
    assert elapsed < 4 * 0.5 + 1.5
    assert all(0 < t <= 60 for _d, _v, t in calls)

    # The fleet's answer is what a device differs from: the first tensor that differs.
    shifted = audit_document("shifted", 1, shift=1e-3)
    other = {r["variant"]: r for r in shifted["results"] if r["status"] == "ok"}

    caches: set[Any] = set()

    def shifted_child(variant: str, *, device: str, **more: Any
                      ) -> tuple[None, list[dict[str, Any]]]:
        caches.add(more.get("compile_cache"))
        source = other if device == "cuda:0" else fleet_node["answers"]
        return None, [dict(source[variant], device=device)]

    monkeypatch.setattr(_suite, "run_variant", shifted_child)
    # The node's compile_cache setting is where a compiled answer's child compiles.
    monkeypatch.setenv("NUMPARITY_COMPILE_CACHE", "/var/cache/numparity-inductor")
    code = _cli.main(["check", "--server", fleet_node["server"].base_url, "--json",
                      "--variants", "strict"])
    report = json.loads(capsys.readouterr().out)
    assert code == 10 and report["chosen_by"] == "server"  # variants narrow its choice
    bad, good = report["devices"]
    assert (bad["device"], bad["verdict"]) == ("cuda:0", "no-go")
    assert [(a["variant"], a["status"], a["first_differing"]) for a in bad["answers"]] == \
        [("strict", "differs", "conv2")]
    assert (good["device"], good["verdict"]) == ("cuda:1", "go")
    assert {str(c) for c in caches} == {"/var/cache/numparity-inductor"}
    # Issue 44: what the benchmarks measured of this plan (cnn/strict), from the figures
    # the agent ships, pooled exactly as `_proof.plan_proof` does it.
    from numparity_agent import _proof

    assert report["proof"] == _proof.plan_proof(["cnn"])
    assert report["proof"]["workloads_measured"] == ["cnn"]


def test_the_watchdog_stops_a_step_that_overruns_and_its_children(tmp_path: Any) -> None:
    """A step stuck past the budget (here the listing, with a child of its own that never
    ends): at the budget's end the watchdog kills the child, says why and exits 14."""
    import subprocess
    import sys

    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, time\n"
        "from numparity_agent import _check, _cli\n"
        "def stuck(selection, deadline):\n"
        "    child = subprocess.Popen(['sleep', '600'])\n"
        f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(600)\n"
        "_check.list_node = stuck\n"
        "raise SystemExit(_cli.main(['check', '--server', 'http://127.0.0.1:9', "
        "'--token', 'np_x', '--max-seconds', '4', '--json']))\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True,
                          text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 14, done.stderr
    report = json.loads(done.stdout)
    assert report["cause"] == "out_of_time" and "children killed" in report["detail"]
    assert report["seconds"] <= 4
    assert elapsed < 4 + 5
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # killed, waiting for init to reap it
        except OSError:
            break  # gone
        time.sleep(0.1)
    else:
        raise AssertionError(f"the stuck child {child} still runs")
