"""`make gpu-check`: numparity's CUDA paths, run for real on this machine's GPU, in one
table. No network: the agent runs from this checkout, the server is embedded (a
`numparity-server serve` on 127.0.0.1 with SQLite in a temporary folder).

    python tools/gpu_check.py [--device cuda:0] [--workloads W ...] [--keep DIR]

Each row is a check of issue 28 ("first contact with a real GPU"), with its status
(`ok`, `FAIL`, or `n/a` with the reason) and what it measured:

- identity: NVML's UUID, serial, PCI bus id, name and compute capability of the device;
- variants: the standard suite under every variant on the device (fp64-reference on
  the CPU), uploaded; each variant's statuses, skip reasons, the overhead per variant
  and the fingerprint overhead from the document's timeline (targets 3 s and 10 %);
- TF32 split: a second node with NVIDIA_TF32_OVERRIDE=0 uploads cnn, mlp; /divergence
  splits cnn (cuDNN convolutions use TF32 by default) and names
  env_vars.NVIDIA_TF32_OVERRIDE; mlp stays identical (matmul TF32 is off by default);
- explain: the stock node finds the setting that gives the TF32-off node's bits;
- SDPA backends: the backends the decoder's attention ran through, and whether they
  agree with math (`checks.attention_backends_agree`);
- NCCL collectives: the collectives workload over NCCL on every visible GPU;
- profiler kernel names: `--trace-ops` records the CUDA kernels of the GEMMs and
  convolutions, and what tracing costs (traced / untraced child, target 1.3x);
- large-suite upload: `run --suite large` (default variant) reaches the server whole;
- CUDA isclose: torch.isclose on the device against the judge
  (`numparity_server.analysis.closeness`) on float16/bfloat16 pairs at the boundary.

With NUMPARITY_GPU_CHECK_FAKE=1 the GPU is faked at the edge (tests/helpers/fake_cuda:
NVML, torch.cuda's answers; `cuda:0` computes on the CPU), so the whole check runs end
to end on a machine without one (CI runs it so, `tests/tools/test_gpu_check_dry_run.py`); rows
whose answer only a GPU gives say so as `n/a`.

Exit status 0 when no row is FAIL, 1 otherwise, 2 when the check cannot start.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FAKE_ENV = "NUMPARITY_GPU_CHECK_FAKE"
# Agent nodes that upload from the machine the stock node reports: their GPUs travel
# without UUID and serial.
SHARING_NODES = frozenset({"gpu-check-tf32-off", "gpu-check-large"})
FAKE_CUDA = ROOT / "tests" / "helpers" / "fake_cuda"
# The fake GPU of fake mode: an H200 as NVML and torch.cuda describe it.
FAKE_GPU = {"uuid": "GPU-00000000-0000-4000-8000-000000000028", "serial": "1654923000028",
            "pci_bus_id": "00000000:19:00.0", "name": "NVIDIA H200 (fake)", "cc": "9.0"}
STANDARD = ["mlp", "cnn", "transformer", "lstm", "train", "probes", "decoder",
            "invariance", "collectives"]
TARGET_TRACE_RATIO = 1.3
TARGET_VARIANT_OVERHEAD_S = 3.0
TARGET_FINGERPRINT = 0.10
ISCLOSE_PAIRS = 200_000


@dataclass
class Row:
    check: str
    status: str  # ok | FAIL | n/a
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


class Check:
    """The state one check run shares: the work folder, the embedded server and its
    tokens, the agents' environment (fake GPUs or not), the documents made so far."""

    def __init__(self, work: Path, *, device: str, workloads: list[str], fake: bool,
                 variants: list[str] | None = None) -> None:
        self.work = work
        self.device = device
        self.workloads = workloads
        self.variants = variants
        self.fake = fake
        self.server = ""
        self.tokens: dict[str, str] = {}
        self.documents: dict[str, dict[str, Any]] = {}
        self.identity: dict[str, Any] = {}
        self.all_devices: list[dict[str, Any]] = []
        self.split: dict[str, Any] = {}
        # When the row now running must have answered (time.monotonic()): every process
        # a row starts gets what is left of it as its timeout.
        self.deadline = float("inf")

    def remaining(self) -> float:
        """Seconds left to the row now running (at least 1: a process gets to start)."""
        return max(min(self.deadline - time.monotonic(), 24 * 3600.0), 1.0)

    # ---- processes ------------------------------------------------------------------

    def agent_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")}
        paths = [str(ROOT / "tests" / "agent")]  # user workloads of the tests, unused here
        if self.fake:
            paths.insert(0, str(FAKE_CUDA))
            env["NUMPARITY_TEST_FAKE_GPUS"] = json.dumps([{**FAKE_GPU, "threads": 2}])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
        env.update(extra)
        return env

    def agent(self, *args: str, node: str = "gpu-check", env: dict[str, str] | None = None,
              upload: bool = True) -> subprocess.CompletedProcess[str]:
        flags = ["--node", node] if args and args[0] in ("run", "explain") else []
        if node in SHARING_NODES:
            # The stock node owns this machine's GPUs: a second node reporting them by
            # UUID would be a claim on them (design §3.1); it reports them anonymously.
            env = {**(env or self.agent_env()), "NUMPARITY_ANONYMOUS_DEVICES": "1"}
        if upload and args and args[0] in ("run", "explain"):
            flags += ["--server", self.server, "--token-file", str(self.work / "agent.token"),
                      "--spool", str(self.work / f"spool-{node}")]
        done = subprocess.run([sys.executable, "-m", "numparity_agent", *args, *flags],
                              env=env or self.agent_env(), capture_output=True, text=True,
                              timeout=self.remaining(), check=False)
        # Each agent's log, whole, beside the database (--keep): a row shows its last line.
        with (self.work / f"agent-{node}.log").open("a") as log:
            log.write(f"$ numparity-agent {' '.join(args)}\n{done.stderr}")
        return done

    def server_cli(self, *args: str) -> str:
        env = {**os.environ, "NUMPARITY_DATABASE_URL": self.database_url}
        done = subprocess.run([sys.executable, "-m", "numparity_server.cli", *args], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"numparity-server {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.work / 'numparity.db'}"

    @contextlib.contextmanager
    def embedded_server(self) -> Iterator[None]:
        """`numparity-server serve` on a free loopback port, on SQLite, with an agent and
        a reader token; stopped afterwards."""
        self.server_cli("migrate")
        port = _free_port()
        env = {**os.environ, "NUMPARITY_DATABASE_URL": self.database_url}
        log = (self.work / "server.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "numparity_server.cli", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            self.server = f"http://127.0.0.1:{port}"
            for role in ("agent", "reader"):
                self.tokens[role] = self.server_cli(
                    "token", "create", "--role", role, "--label", f"gpu-check-{role}").strip()
            (self.work / "agent.token").write_text(self.tokens["agent"] + "\n")
            _wait_ready(self.server, process)
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()

    def get(self, path: str, **params: Any) -> Any:
        import httpx

        response = httpx.get(f"{self.server}/api/v1{path}", params=params,
                             timeout=min(self.remaining(), 120),
                             headers={"Authorization": f"Bearer {self.tokens['reader']}"})
        response.raise_for_status()
        return response.json()

    def run_document(self, name: str, *args: str, node: str, env: dict[str, str] | None = None,
                     upload: bool = True) -> tuple[dict[str, Any] | None, str]:
        """A `run` with `--output`: (its document or None, the reason it has none)."""
        out = self.work / f"{name}.json"
        done = self.agent("run", "--device", self.device, *args, "--output", str(out),
                          node=node, env=env, upload=upload)
        if not out.exists():
            return None, f"exit {done.returncode}: {_last_line(done.stderr)}"
        document: dict[str, Any] = json.loads(out.read_text())
        self.documents[name] = document
        return document, "" if done.returncode == 0 else \
            f"exit {done.returncode}: {_last_line(done.stderr)}"


# ---- the checks -------------------------------------------------------------------------


def check_identity(check: Check) -> Row:
    done = subprocess.run([sys.executable, "-m", "numparity_agent._devices"],
                          env=check.agent_env(), capture_output=True, text=True,
                          timeout=check.remaining(), check=False)
    if done.returncode != 0:
        return Row("identity", "FAIL", f"listing the devices failed: {_last_line(done.stderr)}")
    devices = json.loads(done.stdout)
    check.all_devices = devices
    mine = next((d for d in devices if d.get("device") == check.device), None)
    if mine is None:
        return Row("identity", "FAIL", f"{check.device} is not among "
                   f"{', '.join(d.get('device', '?') for d in devices) or 'no devices'}")
    fields = ("uuid", "serial", "pci_bus_id", "name", "compute_capability")
    check.identity = mine
    missing = [f for f in fields if not mine.get(f)]
    detail = (f"{mine.get('name')}, cc {mine.get('compute_capability')}, {mine.get('uuid')}, "
              f"serial {mine.get('serial')}, PCI {mine.get('pci_bus_id')}")
    if missing:
        return Row("identity", "FAIL", f"{detail}; missing: {', '.join(missing)}", mine)
    return Row("identity", "ok", detail, mine)


# NVML's MIG instances, independently of the agent's enumeration (`_devices`): per GPU in
# MIG mode, the UUIDs of its instances.
MIG_SCRIPT = """
import json
try:
    import pynvml
    pynvml.nvmlInit()
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
found = {}
every = []
count = pynvml.nvmlDeviceGetCount()
for i in range(count):
    board = pynvml.nvmlDeviceGetHandleByIndex(i)
    every.append(text(pynvml.nvmlDeviceGetUUID(board)))
    try:
        mode = pynvml.nvmlDeviceGetMigMode(board)[0]
    except Exception:
        continue
    if not mode:
        continue
    uuids = []
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(board)):
        try:
            uuids.append(text(pynvml.nvmlDeviceGetUUID(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(board, j))))
        except Exception:
            pass
    found[text(pynvml.nvmlDeviceGetUUID(board))] = uuids
    every += uuids
print(json.dumps({"gpus": count, "mig": found, "every": every}))
"""


def check_mig(check: Check) -> Row:
    """Every MIG instance NVML shows is a device of `--device all`: CUDA shows a process
    one MIG instance, the agent finds the others in NVML (issue 42, 11); and the stock
    run's `node_gpus` is NVML's every GPU and instance of the node."""
    done = subprocess.run([sys.executable, "-c", MIG_SCRIPT], env=check.agent_env(),
                          capture_output=True, text=True, timeout=check.remaining(),
                          check=False)
    if done.returncode != 0:
        return Row("MIG instances", "FAIL", f"asking NVML failed: {_last_line(done.stderr)}")
    nvml = json.loads(done.stdout)
    if "error" in nvml:
        return Row("MIG instances", "n/a", f"no NVML here ({nvml['error']})")
    problems = []
    stock = check.documents.get("stock")
    node_gpus = f"node_gpus: {len(nvml['every'])}, NVML's"
    if stock is not None and sorted(stock.get("node_gpus") or []) != sorted(nvml["every"]):
        node_gpus = f"node_gpus {stock.get('node_gpus')} is not NVML's {nvml['every']}"
        problems.append(node_gpus)
    instances = {u for uuids in nvml["mig"].values() for u in uuids}
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not instances or listed is not None:
        why = (f"CUDA_VISIBLE_DEVICES={listed}: the devices are that allocation's"
               if listed is not None else f"no GPU in MIG mode among NVML's {nvml['gpus']}")
        return Row("MIG instances", "FAIL" if problems else "n/a", f"{why}; {node_gpus}",
                   nvml)
    devices = {d.get("uuid"): d.get("device") for d in check.all_devices}
    missing = sorted(instances - set(devices))
    slots = [str(devices[u]) for u in sorted(instances) if u in devices]
    detail = (f"{len(instances)} instance(s) on {len(nvml['mig'])} GPU(s) in MIG mode; "
              f"devices of all: {', '.join(slots) or 'none'}; {node_gpus}")
    if missing:
        problems.append(f"not listed: {', '.join(missing)}")
    if problems:
        return Row("MIG instances", "FAIL", f"{detail}; {'; '.join(problems)}", nvml)
    return Row("MIG instances", "ok", detail, nvml)


def check_variants(check: Check) -> list[Row]:
    chosen = ["--variants", *check.variants] if check.variants else []
    document, error = check.run_document("stock", "--workloads", *check.workloads, *chosen,
                                         node="gpu-check-stock")
    if document is None:
        return [Row("variants", "FAIL", error)]
    rows = []
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for result in document["results"]:
        by_variant.setdefault(result["variant"], []).append(result)
    failed = {v: rs for v, rs in by_variant.items() if any(r["status"] == "failed" for r in rs)}
    parts = []
    for variant, results in by_variant.items():
        counts: dict[str, int] = {}
        for r in results:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        text = f"{variant} " + "/".join(f"{n} {s}" for s, n in sorted(counts.items()))
        skipped = next((r for r in results if r["status"] == "skipped"), None)
        if skipped is not None:
            text += f" ({_short(skipped.get('reason', ''))})"
        parts.append(text)
    first_failure = next((r for rs in failed.values() for r in rs if r["status"] == "failed"),
                         None)
    status = "FAIL" if failed else "ok"
    detail = "; ".join(parts)
    if first_failure is not None:
        detail += f"; first failure {first_failure['workload']}/{first_failure['variant']}: " \
                  f"{_short(first_failure.get('error', ''))}"
    if error:
        detail += f"; {error}"
    rows.append(Row("variants", status, detail, {"variants": sorted(by_variant)}))
    rows.append(_timeline_row(document, check.fake))
    return rows


def _timeline_row(document: dict[str, Any], fake: bool) -> Row:
    """Overhead per variant (child wall less its runs, over its variants) and the
    fingerprint overhead, from the document's timeline (design §2.7)."""
    timeline = [t for t in document.get("timeline", []) if t.get("phases")]
    if not timeline:
        return Row("variant overhead", "FAIL", "the document has no timeline")
    overheads = [(child["wall_s"] - child["phases"].get("run_s", 0.0))
                 / max(len(child["variants"]), 1) for child in timeline]
    ok = [r for r in document["results"] if r["status"] == "ok" and "timeline" in r]
    fp = sum(r["timeline"].get("fingerprint_s", 0.0) for r in ok)
    run = sum(r["timeline"].get("run_s", 0.0) for r in ok)
    share = fp / run if run else 0.0
    worst = max(overheads)
    slowest = max(timeline, key=lambda t: t["wall_s"])
    phases = ", ".join(f"{k.removesuffix('_s')} {v:.2f}"
                       for k, v in slowest["phases"].items() if v >= 0.05)
    detail = (f"{len(timeline)} children, worst {worst:.2f} s per variant (target "
              f"{TARGET_VARIANT_OVERHEAD_S:.0f} s); fingerprint {share:.1%} of run time "
              f"(target {TARGET_FINGERPRINT:.0%}); slowest child "
              f"({', '.join(slowest['variants'])}): {phases}")
    status = "ok" if worst <= TARGET_VARIANT_OVERHEAD_S and share <= TARGET_FINGERPRINT \
        else "FAIL"
    data = {"worst_s": worst, "fingerprint_share": share, "children": len(timeline)}
    if fake:
        return Row("variant overhead", "n/a", detail + " (fake CUDA: the targets are a "
                   "GPU's)", data)
    return Row("variant overhead", status, detail, data)


def _hashes(document: dict[str, Any], workload: str, variant: str) -> dict[str, str] | None:
    result = _result(document, workload, variant)
    if result is None or result.get("status") != "ok":
        return None
    return {t["name"]: t["hash"] for t in result.get("tensors", [])}


def _overhead(document: dict[str, Any]) -> float:
    """Mean overhead per variant over the document's children (wall less runs)."""
    children = [t for t in document.get("timeline", []) if t.get("phases")]
    per_variant = [(t["wall_s"] - t["phases"].get("run_s", 0.0)) / max(len(t["variants"]), 1)
                   for t in children]
    return sum(per_variant) / max(len(per_variant), 1)


def check_fork_server(check: Check) -> Row:
    """The stock run's children were forked from the agent's fork server (design §2.3):
    its results are a fresh-interpreter run's bit for bit, and a forked probe child sees
    its own environment (CUBLAS_WORKSPACE_CONFIG, this device alone) with CUDA not yet
    initialised."""
    stock = check.documents.get("stock")
    if stock is None:
        return Row("fork server", "FAIL", "no stock run to compare with")
    log = check.work / "agent-gpu-check-stock.log"
    refused = [line for line in (log.read_text().splitlines() if log.exists() else [])
               if "ran in a fresh interpreter" in line]
    workload = "mlp" if "mlp" in check.workloads else check.workloads[0]
    variants = [v for v in ("default", "strict") if _hashes(stock, workload, v)]
    if not variants:
        return Row("fork server", "FAIL", f"the stock run has no {workload} result to compare")
    fresh, error = check.run_document("fresh", "--workloads", workload, "--variants",
                                      *variants, "--fresh-interpreters",
                                      node="gpu-check-fresh", upload=False)
    if fresh is None:
        return Row("fork server", "FAIL", f"the fresh-interpreter run: {error}")
    differ = [v for v in variants if _hashes(fresh, workload, v) != _hashes(stock, workload, v)]
    probe = _fork_probe(check)
    uuid = str(check.identity.get("uuid") or "")
    problems = [f"{workload}/{v} differs from a fresh interpreter's" for v in differ]
    problems += [_short(line) for line in refused[:2]]
    if "error" in probe:
        problems.append(probe["error"])
    else:
        if not probe["torch_imported_before"] or probe["cuda_initialised"]:
            problems.append("the probe child was not forked before CUDA's initialisation")
        if probe["getenv"]["CUBLAS_WORKSPACE_CONFIG"] != ":4096:8":
            problems.append("CUBLAS_WORKSPACE_CONFIG not in the forked child's environment")
        if uuid and probe["devices"] != [uuid.split("-", 1)[-1]]:
            problems.append(f"the forked child saw {probe['devices']}, not {uuid} alone")
    detail = (f"{workload} under {', '.join(variants)}: forked = fresh bit for bit"
              if not differ else f"{workload}: {len(differ)} variant(s) differ")
    detail += (f"; overhead per variant forked {_overhead(stock):.2f} s, fresh "
               f"{_overhead(fresh):.2f} s")
    if problems:
        detail += "; " + "; ".join(problems)
    data = {"differ": differ, "refused": refused, "probe": probe,
            "overhead_forked_s": _overhead(stock), "overhead_fresh_s": _overhead(fresh)}
    return Row("fork server", "FAIL" if problems else "ok", detail, data)


def _fork_probe(check: Check) -> dict[str, Any]:
    """What a child forked from a fork server of this machine sees (tests/agent/
    agent_test_probe_env.py), with this device alone and the strict variant's variable."""
    from numparity_agent._forkserver import ForkServer

    env = check.agent_env()
    with ForkServer(env, ready_timeout=check.remaining()) as server:
        wanted = {**env, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        if check.identity.get("uuid"):
            wanted["CUDA_VISIBLE_DEVICES"] = str(check.identity["uuid"])
        refusal = server.refuses(wanted)
        if refusal is not None:
            return {"error": f"the fork server refused: {refusal}"}
        out, err = check.work / "probe.stdout", check.work / "probe.stderr"
        child = server.spawn("agent_test_probe_env", [], env=wanted, stdout=str(out),
                             stderr=str(err))
        code = child.wait(check.remaining())
        if code is None:
            child.kill()
            return {"error": "the forked probe child did not answer in time"}
        if code != 0:
            return {"error": f"the forked probe child exited {code}: "
                             f"{_last_line(err.read_text())}"}
        probe: dict[str, Any] = json.loads(out.read_text())
    return probe


def check_tf32_split(check: Check) -> list[Row]:
    rows = _tf32_split(check)
    check.split = rows[0].data
    return rows


def _tf32_split(check: Check) -> list[Row]:
    stock = check.documents.get("stock")
    if stock is None:
        return [Row("TF32 split", "FAIL", "no stock run to compare with")]
    # The TF32-off node uploads the same workloads under default (a node of its own).
    env = check.agent_env(NVIDIA_TF32_OVERRIDE="0")
    document, error = check.run_document("tf32-off", "--workloads", "cnn", "mlp",
                                         "--variants", "default", node="gpu-check-tf32-off",
                                         env=env)
    if document is None:
        return [Row("TF32 split", "FAIL", error)]
    found = {}
    for workload in ("cnn", "mlp"):
        report = check.get("/divergence", workload=workload, variant="default")
        found[workload] = report
    cnn, mlp = found["cnn"], found["mlp"]
    attributes = [a.get("attribute") for pair in cnn.get("pairs", [])
                  for a in pair.get("attribution", [])]
    detail = (f"cnn {len(cnn.get('groups', []))} groups, mlp {len(mlp.get('groups', []))}; "
              f"cnn split named by {', '.join(dict.fromkeys(attributes)) or 'nothing'}")
    split = len(cnn.get("groups", [])) == 2 and "env_vars.NVIDIA_TF32_OVERRIDE" in attributes
    data = {"tf32_off_run": document["run_id"], "split": split}
    if check.fake:
        return [Row("TF32 split", "n/a", detail + " (fake CUDA computes on the CPU: no TF32 "
                    "to turn off; both runs stored and compared)", data)]
    if len(mlp.get("groups", [])) != 1:
        return [Row("TF32 split", "FAIL", detail + "; mlp should stay identical", data)]
    return [Row("TF32 split", "ok" if split else "FAIL", detail, data)]


def check_explain(check: Check, split: dict[str, Any]) -> Row:
    if not split.get("tf32_off_run"):
        return Row("explain", "n/a", "no TF32-off run to explain")
    out = check.work / "explain.json"
    start = time.monotonic()
    done = check.agent("explain", "--against", split["tf32_off_run"], "--workloads", "cnn",
                       "--variants", "default", "--device", check.device, "--output", str(out),
                       node="gpu-check-stock")
    seconds = time.monotonic() - start
    if not out.exists():
        return Row("explain", "FAIL", f"exit {done.returncode}: {_last_line(done.stderr)}")
    findings = json.loads(out.read_text()).get("findings", [])
    finding = findings[0] if findings else {}
    detail = (f"cnn/default {finding.get('status')}: {finding.get('label') or '-'} "
              f"in {finding.get('tried')} tries, {seconds:.1f} s")
    if not split.get("split"):
        return Row("explain", "n/a", detail + " (no split to explain)")
    ok = finding.get("status") == "reproduced"
    return Row("explain", "ok" if ok else "FAIL", detail, finding)


# The SDPA backends and the dtypes each takes (torch's sdp_utils.cpp: flash and cuDNN
# attention take float16 and bfloat16 only, from compute capability 8.0; memory-efficient
# attention also float32, from 5.0; math anything). The decoder's default variant is
# float32: flash cannot run there, so the fused backends are probed under half types.
SDPA_DTYPES = {"flash": ("float16", "bfloat16"), "cudnn": ("float16", "bfloat16"),
               "efficient": ("float32", "float16", "bfloat16"),
               "math": ("float32", "float16", "bfloat16")}
SDPA_MIN_CC = {"flash": (8, 0), "cudnn": (8, 0), "efficient": (5, 0), "math": (0, 0)}
# cuDNN attention is optional (a torch built with cuDNN >= 9, and torch's own gating):
# reported, never required.
SDPA_REQUIRED = ("flash", "efficient", "math")
# Each fused backend's output against float64 math, as a multiple of the dtype's eps
# (one rounding of the output plus float32 accumulation in blocks: a few eps).
SDPA_EPS_BOUND = 8.0


def sdpa_expected(dtype: str, cc: tuple[int, int]) -> set[str]:
    """The backends that must run attention in `dtype` on a GPU of capability `cc`."""
    return {b for b in SDPA_REQUIRED if dtype in SDPA_DTYPES[b] and cc >= SDPA_MIN_CC[b]}


def sdpa_probe(slot: str) -> dict[str, Any]:
    """Each backend under float16 and bfloat16 on `slot` (`--sdpa-probe`, in a child: it
    computes on the device): whether it ran, and its largest error against float64
    math in eps of the dtype."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from numparity_agent._devices import torch_device

    device = torch_device(slot)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends["cudnn"] = SDPBackend.CUDNN_ATTENTION
    generator = torch.Generator().manual_seed(42)
    q, k, v = (torch.randn(2, 4, 128, 64, generator=generator, dtype=torch.float64)
               for _ in range(3))
    found: dict[str, Any] = {}
    for dtype_name in ("float16", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        qd, kd, vd = (t.to(dtype) for t in (q, k, v))
        exact = F.scaled_dot_product_attention(qd.double(), kd.double(), vd.double())
        eps = torch.finfo(dtype).eps
        for name, backend in backends.items():
            try:
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(qd.to(device), kd.to(device),
                                                         vd.to(device))
                error = float((out.double().cpu() - exact).abs().max()) / eps
                found[f"{name}/{dtype_name}"] = {"ran": True, "eps": round(error, 3)}
            except RuntimeError as exc:
                found[f"{name}/{dtype_name}"] = {"ran": False,
                                                 "reason": _short(str(exc), 120)}
    return found


def check_sdpa(check: Check) -> Row:
    """The fused attention backends under float16 and bfloat16 on the device (each
    against float64 math), and what the decoder's float32 attention ran through."""
    done = subprocess.run([sys.executable, __file__, "--sdpa-probe", check.device],
                          env=check.agent_env(), capture_output=True, text=True,
                          timeout=check.remaining(), check=False)
    if done.returncode != 0:
        return Row("SDPA backends", "FAIL", f"the probe failed: {_last_line(done.stderr)}")
    probes: dict[str, Any] = json.loads(done.stdout)
    ran = sorted(k for k, p in probes.items() if p["ran"])
    cc = _cc(check.identity.get("compute_capability")) if not check.fake else (0, 0)
    missing = sorted(f"{b}/{d}" for d in ("float16", "bfloat16") for b in sdpa_expected(d, cc)
                     if not probes.get(f"{b}/{d}", {}).get("ran"))
    wrong = sorted(k for k, p in probes.items() if p["ran"] and p["eps"] > SDPA_EPS_BOUND)
    worst = max((p["eps"] for p in probes.values() if p["ran"]), default=0.0)
    detail = (f"fp16/bf16 ran {', '.join(ran) or 'none'}; worst {worst:.1f} eps from float64 "
              f"math (bound {SDPA_EPS_BOUND:g})")
    decoder = _result(check.documents.get("stock"), "decoder", "default")
    decoder_backends: list[str] = []
    if decoder is not None and decoder["status"] == "ok":
        decoder_backends = [t["name"].removeprefix("sdpa.") for t in decoder["tensors"]
                            if t["name"].startswith("sdpa.")]
        detail += f"; decoder/default (float32) ran {', '.join(decoder_backends) or 'none'}"
    if missing:
        detail += f"; did not run: {', '.join(missing)}"
    if wrong:
        detail += f"; past the bound: {', '.join(wrong)}"
    data = {"probes": probes, "decoder_backends": decoder_backends, "missing": missing}
    if check.fake:
        return Row("SDPA backends", "n/a", detail + " (fake CUDA: the CPU's backends)", data)
    return Row("SDPA backends", "FAIL" if missing or wrong else "ok", detail, data)


def check_collectives(check: Check) -> Row:
    result = _result(check.documents.get("stock"), "collectives", "default")
    if result is None:
        return Row("NCCL collectives", "n/a", "collectives not in this check's workloads")
    if result["status"] != "ok":
        return Row("NCCL collectives", "FAIL", f"{result['status']}: "
                   f"{_short(result.get('error') or result.get('reason', ''))}")
    info = result.get("collectives", {})
    backend = info.get("backend")
    detail = (f"backend {backend}, world size {info.get('world_size')}, repeats agree: "
              f"{result.get('repeats_agree')}")
    if check.fake:
        return Row("NCCL collectives", "n/a", detail + " (fake CUDA: gloo on the CPU)", info)
    return Row("NCCL collectives", "ok" if backend == "nccl" else "FAIL", detail, info)


# Workloads whose repeats agree bitwise on a GPU under `strict` (deterministic
# algorithms): a trace is kept only when its pass recorded the fingerprinted bits, so
# `probes` (index_add_'s atomics) or a nondeterministic backward would fail the row for
# the GPU's arithmetic, not for the profiler.
TRACE_WORKLOADS = ("mlp", "cnn", "transformer")
TRACE_VARIANT = "strict"


def trace_workloads(workloads: list[str]) -> list[str]:
    """The deterministic workloads the kernel-names row traces (mlp at least)."""
    return [w for w in workloads if w in TRACE_WORKLOADS] or ["mlp"]


def check_kernel_names(check: Check) -> Row:
    """`--trace-ops` on the device: kernel names on GEMMs and convolutions, and the cost
    (the strict variant's child, traced over untraced), on deterministic workloads."""
    workloads = trace_workloads(check.workloads)
    plain, error = check.run_document("untraced", "--workloads", *workloads, "--variants",
                                      TRACE_VARIANT, node="gpu-check-trace", upload=False)
    traced, error_traced = check.run_document("traced", "--workloads", *workloads,
                                              "--variants", TRACE_VARIANT, "--trace-ops",
                                              node="gpu-check-trace", upload=False)
    if plain is None or traced is None:
        return Row("profiler kernel names", "FAIL", error or error_traced)
    ratio = _child_wall(traced) / max(_child_wall(plain), 1e-9)
    ops = [op for body in traced.get("traces", []) for op in body["ops"]]
    named = [op for op in ops if op.get("kernel") and not
             op["kernel"].startswith(("conv:", "sdpa:")) or "; " in op.get("kernel", "")]
    errors = [r["trace_error"] for r in traced["results"] if r.get("trace_error")]
    examples = sorted({op["kernel"].split("; ")[-1] for op in named})[:2]
    detail = (f"{', '.join(workloads)}/{TRACE_VARIANT}: {len(named)} of {len(ops)} ops name "
              f"CUDA kernels ({'; '.join(examples) or '-'}); traced/untraced {ratio:.2f}x "
              f"(target {TARGET_TRACE_RATIO}x)")
    if errors:
        detail += f"; trace_error: {_short(errors[0])}"
    data = {"ratio": ratio, "named": len(named), "workloads": workloads,
            "variant": TRACE_VARIANT, "trace_errors": len(errors)}
    if check.fake:
        return Row("profiler kernel names", "n/a",
                   detail + " (fake CUDA: no CUDA kernels to name)", data)
    ok = named and not errors and ratio <= TARGET_TRACE_RATIO
    return Row("profiler kernel names", "ok" if ok else "FAIL", detail, data)


def check_large_upload(check: Check) -> Row:
    # On fake CUDA the CPU computes: one workload of the large suite, 24.5 MiB of values.
    workloads = ["--workloads", "resnet_block"] if check.fake else []
    document, error = check.run_document("large", "--suite", "large", "--variants", "default",
                                         *workloads, node="gpu-check-large")
    spool = check.work / "spool-gpu-check-large"
    rejected = sorted(p.name for p in (spool / "rejected").glob("*")) \
        if (spool / "rejected").exists() else []
    if document is None:
        return Row("large-suite upload", "FAIL", error)
    stored = True
    try:
        check.get(f"/runs/{document['run_id']}")
    except Exception as exc:  # noqa: BLE001 - the row says why
        stored, error = False, error or f"GET /runs: {exc}"
    size = len(json.dumps(document)) / 2**20
    detail = (f"{len(document['results'])} results, document {size:.1f} MiB; "
              f"stored: {stored}; rejected: {', '.join(rejected) or 'none'}")
    if error:
        detail += f"; {error}"
    ok = stored and not rejected and not error
    return Row("large-suite upload", "ok" if ok else "FAIL", detail)


def check_isclose(check: Check) -> Row:
    """torch.isclose on the device against the judge, float16/bfloat16 pairs at the
    boundary (the default tolerances and rtol 1e-2, atol 1e-3). The judge counts close
    pairs: over the pairs isclose calls close it must count all, over the others none,
    so the pairs it calls otherwise are (close - its count there) + its count among the
    others, exactly."""
    import torch

    try:
        from numparity_server.analysis import closeness
        from numparity_server.analysis.tolerance import Tolerance
    except ImportError as exc:
        return Row("CUDA isclose", "FAIL", f"the judge cannot be imported: {exc}")
    cuda = not check.fake and torch.cuda.is_available()
    device = torch.device(check.device if cuda else "cpu")
    semantics = "semantics" in inspect.signature(closeness.close_count).parameters
    kwargs = {"semantics": "cuda" if cuda else "cpu"} if semantics else {}
    cases = [("float16", 1e-3, 1e-5), ("float16", 1e-2, 1e-3),
             ("bfloat16", 1.6e-2, 1e-5), ("bfloat16", 1e-2, 1e-3)]
    differing = []
    generator = torch.Generator().manual_seed(28)
    for dtype_name, rtol, atol in cases:
        dtype = getattr(torch, dtype_name)
        b = (torch.rand(ISCLOSE_PAIRS, generator=generator) * 8 - 4).to(dtype)
        allowed = atol + rtol * b.float().abs()
        step = (torch.rand(ISCLOSE_PAIRS, generator=generator) * 4 - 2) * allowed
        a = (b.float() + step).to(dtype)
        close = torch.isclose(a.to(device), b.to(device), rtol=rtol, atol=atol).cpu()
        x, y = a.float().numpy(), b.float().numpy()
        mask = close.numpy()
        tolerance = Tolerance(rtol=rtol, atol=atol)
        judged_close = closeness.close_count(x[mask], y[mask], dtype_name, tolerance, **kwargs)
        judged_other = closeness.close_count(x[~mask], y[~mask], dtype_name, tolerance,
                                             **kwargs)
        differing.append((dtype_name, rtol, atol,
                          int(mask.sum()) - judged_close + judged_other))
    text = ", ".join(f"{d} rtol {r:g} atol {t:g}: {n}" for d, r, t, n in differing)
    detail = (f"pairs the judge calls otherwise than torch.isclose on {device.type} "
              f"(of {ISCLOSE_PAIRS:,} each): {text}")
    total = sum(n for *_, n in differing)
    data = {"differing": total, "semantics": kwargs.get("semantics")}
    if not semantics:
        return Row("CUDA isclose", "n/a", "CUDA semantics not available in this build "
                   "(the judge has the CPU's arithmetic only); " + detail, data)
    if not cuda:
        return Row("CUDA isclose", "n/a", detail + " (fake CUDA: the CPU's isclose)", data)
    return Row("CUDA isclose", "ok" if total == 0 else "FAIL", detail, data)


def check_compiled(check: Check) -> Row:
    """The compiled variant on the device (design §2.14): mlp through torch.compile
    (Inductor, Triton on CUDA) beside eager, twice (the second compile from the cache),
    and the server's verdict of compiled against eager. On fake CUDA Inductor would
    compile for the CPU (minutes, cold): not run."""
    if check.fake:
        return Row("compiled", "n/a", "fake CUDA: Inductor would compile C++ for the CPU, "
                   "not Triton for a GPU; the compiled row needs a real one")
    document, error = check.run_document("compiled", "--workloads", "mlp", "--variants",
                                         "default", "compiled", "--repeats", "2",
                                         node="gpu-check-compiled")
    if document is None:
        return Row("compiled", "FAIL", error)
    result = _result(document, "mlp", "compiled")
    if result is None or result["status"] != "ok":
        why = (result or {}).get("reason") or (result or {}).get("error") or error
        return Row("compiled", "FAIL", f"mlp/compiled: {_short(why or 'no result')}")
    record = result.get("compile") or {}
    try:
        verdicts = check.get(f"/runs/{document['run_id']}/compiled")["items"]
    except Exception as exc:  # noqa: BLE001 - the row says why
        return Row("compiled", "FAIL", f"GET /runs/…/compiled: {exc}")
    item = next((v for v in verdicts if v["workload"] == "mlp"), {})
    located = result.get("localisation") or {}
    detail = (f"mlp against eager: {item.get('verdict')} (max ULP {item.get('max_ulp')}, "
              f"first layer {item.get('first_divergent_layer') or '-'}, closer to float64: "
              f"{(item.get('fp64') or {}).get('closer') or '-'}); compile cold "
              f"{record.get('cold_s')} s, warm {record.get('warm_s')} s"
              + (f"; localised at {located['module']} ({', '.join(located['kernels'][:2])})"
                 if located.get("module") else ""))
    ok = item.get("verdict") is not None and record.get("warm_s") is not None
    return Row("compiled", "ok" if ok else "FAIL", detail,
               {"verdict": item.get("verdict"), "compile": record, "localisation": located})


# ---- the table ---------------------------------------------------------------------------


# Each step of the check: the rows it answers (in the table's order) and its deadline
# in seconds on one GPU. A step past its deadline is FAIL with that reason, the steps
# after it still run; the whole check stops starting steps at --deadline.
ROWS = ["identity", "variants", "variant overhead", "fork server", "MIG instances",
        "TF32 split", "explain", "SDPA backends", "NCCL collectives", "profiler kernel names",
        "large-suite upload", "CUDA isclose", "compiled"]
DEADLINES_S = {"identity": 60, "MIG instances": 30, "variants": 240, "fork server": 120,
               "TF32 split": 90, "explain": 120, "compiled": 420,
               "SDPA backends": 60, "NCCL collectives": 5, "profiler kernel names": 150,
               "large-suite upload": 180, "CUDA isclose": 60}
# The fake GPU computes on the CPU: slower, on a machine CI shares.
FAKE_DEADLINE_SCALE = 4.0
DEADLINE_S = 1320.0
# How long past its deadline a step that has not answered is waited for (its processes
# are killed at the deadline; one that hangs in this process is left behind).
HANG_GRACE_S = 5.0


@dataclass
class Step:
    rows: list[str]
    run: Any  # Callable[[Check], list[Row]]
    needs_server: bool = True


def steps() -> list[Step]:
    return [
        Step(["identity"], lambda c: [check_identity(c)], needs_server=False),
        Step(["variants", "variant overhead"], check_variants),
        Step(["fork server"], lambda c: [check_fork_server(c)], needs_server=False),
        Step(["MIG instances"], lambda c: [check_mig(c)], needs_server=False),
        Step(["TF32 split"], check_tf32_split),
        Step(["explain"], lambda c: [check_explain(c, c.split)]),
        Step(["SDPA backends"], lambda c: [check_sdpa(c)]),
        Step(["NCCL collectives"], lambda c: [check_collectives(c)]),
        Step(["profiler kernel names"], lambda c: [check_kernel_names(c)]),
        Step(["large-suite upload"], lambda c: [check_large_upload(c)]),
        Step(["CUDA isclose"], lambda c: [check_isclose(c)], needs_server=False),
        Step(["compiled"], lambda c: [check_compiled(c)]),
    ]


def run_step(check: Check, step: Step, seconds: float) -> list[Row]:
    """The step's rows, or for each a FAIL saying why it has none: an exception, a
    process past the deadline, or no answer at all by then (a hang in this process, on
    the device: the step is left behind in its thread)."""
    check.deadline = time.monotonic() + seconds
    found: list[list[Row]] = []
    failure: list[str] = []

    def target() -> None:
        try:
            found.append(list(step.run(check)))
        except subprocess.TimeoutExpired as exc:
            failure.append(f"past its deadline of {seconds:.0f} s ({_short(str(exc.cmd[-1:]))})")
        except Exception as exc:  # noqa: BLE001 - the row says why, the next rows still run
            failure.append(f"{type(exc).__name__}: {_short(str(exc))}")

    thread = threading.Thread(target=target, daemon=True, name=f"gpu-check {step.rows[0]}")
    thread.start()
    thread.join(seconds + HANG_GRACE_S)
    if thread.is_alive():
        failure.append(f"no answer after {seconds:.0f} s (its deadline): left running")
    if not found:
        return [Row(name, "FAIL", failure[0] if failure else "no answer")
                for name in step.rows]
    rows = found[0]
    answered = {row.check for row in rows}
    # A step that stopped at its first row (no document) measured none of the others.
    return rows + [Row(name, "n/a", f"not measured: {rows[0].check} {rows[0].status}")
                   for name in step.rows if name not in answered]


def run_checks(check: Check, *, on_row: Any = None, deadline_s: float = DEADLINE_S,
               scale: float = 1.0) -> list[Row]:
    """Every step under its deadline, `on_row(row)` as each row is known; past
    `deadline_s` the remaining rows are `n/a` saying so."""
    rows: list[Row] = []
    started = time.monotonic()

    def emit(new: list[Row]) -> None:
        for row in new:
            rows.append(row)
            if on_row is not None:
                on_row(row)

    pending = steps()
    emit(run_step(check, pending.pop(0), DEADLINES_S["identity"] * scale))
    server = contextlib.ExitStack()
    try:
        try:
            server.enter_context(check.embedded_server())
        except Exception as exc:  # noqa: BLE001 - every row that needs it says why
            why = f"the embedded server did not start: {_short(str(exc))}"
            for step in [s for s in pending if s.needs_server]:
                emit([Row(name, "FAIL", why) for name in step.rows])
            pending = [s for s in pending if not s.needs_server]
        for step in pending:
            left = deadline_s - (time.monotonic() - started)
            if left <= 0:
                emit([Row(name, "n/a", f"not run: the check's deadline ({deadline_s:.0f} s) "
                          "passed") for name in step.rows])
                continue
            emit(run_step(check, step, min(DEADLINES_S[step.rows[0]] * scale, left)))
    finally:
        server.close()
    return rows


def _line(row: Row) -> str:
    width = max(len(name) for name in ROWS)
    return f"{row.check:<{width}}  {row.status:<6}  {row.detail}"


def table(rows: list[Row], header: str) -> str:
    width = max(len(name) for name in ROWS)
    lines = [header, f"{'check':<{width}}  status  detail", f"{'-' * width}  ------  ------"]
    lines += [_line(r) for r in rows]
    return "\n".join(lines)


# What the check imports beyond torch: the agent and the server from this checkout, and
# the server's libraries (pyproject.toml's `server` extra).
NEEDED = ("numparity_agent", "numparity_server", "numpy", "httpx", "fastapi", "uvicorn",
          "sqlalchemy", "alembic", "pydantic", "pydantic_settings", "jinja2",
          "prometheus_client", "orjson", "multipart")
WHEELS = Path(os.environ.get("NUMPARITY_GPU_CHECK_WHEELS") or ROOT / "wheels")
SITE = Path(os.environ.get("NUMPARITY_GPU_CHECK_SITE") or ROOT / ".gpu-check" / "site")
# What the checkout's build must not copy: environments, caches, build outputs.
_NOT_SOURCE = (".git", ".venv", "wheels", ".gpu-check", "site", "build", "dist", "*.egg-info",
               "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules")


def _pyproject() -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements() -> list[str]:
    """What `make wheels` downloads and the install from wheels puts in SITE: the
    server's extra and the agent's httpx. numpy is downloaded too (`make wheels`) but
    installed only where the node's Python has none (torch does not require it)."""
    project = _pyproject()["project"]
    agent = [r for r in project["optional-dependencies"]["agent"] if not r.startswith("numpy")]
    return [*agent, *project["optional-dependencies"]["server"]]


def build_requirements() -> list[str]:
    """The checkout's build requirements (pyproject.toml [build-system]: setuptools, and
    MkDocs with its theme, which build the manual into the wheel): pip builds the
    checkout in an isolated environment that it fills from the wheels, with no index."""
    return list(_pyproject()["build-system"]["requires"])


def missing_packages() -> list[str]:
    import importlib.util

    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a broken package
            return False

    return [name for name in NEEDED if not found(name)]


def install_from_wheels(site: Path = SITE) -> str:
    """Install the server's packages from WHEELS and the checkout itself into `site`,
    with no index (`make wheels` fetched them, build requirements included, on a
    machine with network). '' when done, else why not, in pip's own words."""
    if not WHEELS.is_dir() or not any(WHEELS.glob("*.whl")):
        return (f"no {WHEELS.name}/ folder of wheels: run `make wheels` where there is "
                "network and bring the folder (docs/how-to/gpu-type.md)")
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                      check=False).returncode != 0:
        return f"{sys.executable} has no pip to install the wheels with"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
           str(WHEELS), "--target", str(site), "--upgrade"]
    numpy_missing = "numpy" in missing_packages()
    with tempfile.TemporaryDirectory(prefix="gpu-check-source-") as tmp:
        # The checkout is built from a copy: pip builds a folder in place (build/,
        # *.egg-info), and the check leaves the checkout as it found it.
        source = Path(tmp) / "numparity"
        shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE),
                        symlinks=True)
        installs = [("the server's packages", [*pip, "-r", str(WHEELS / "requirements.txt")]),
                    *([("numpy", [*pip, "numpy"])] if numpy_missing else []),
                    ("the checkout", [*pip, "--no-deps", str(source)])]
        for what, step in installs:
            done = subprocess.run(step, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                return f"installing {what} from {WHEELS.name}/ failed: {_pip_reason(done.stderr)}"
    return ""


def _pip_reason(stderr: str) -> str:
    """pip's reason for a failure: its ERROR lines (and the subprocess's own error,
    which pip puts after `╰─>`), not its last line ("note: This error originates from
    a subprocess")."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    picked = [line for line in lines if line.startswith(("ERROR:", "error:"))
              or "No matching distribution" in line or "Could not find a version" in line]
    return _short(" / ".join(dict.fromkeys(picked)) or _last_line(stderr), 600)


# ---- which Python: the one whose torch has CUDA --------------------------------------

CHOSEN_ENV = "NUMPARITY_GPU_CHECK_PYTHON"
_PROBE = ("import json, torch\n"
          "available = torch.cuda.is_available()\n"
          "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda,\n"
          "                  'hip': getattr(torch.version, 'hip', None),\n"
          "                  'available': available,\n"
          "                  'count': torch.cuda.device_count() if available else 0}))\n")


def probe_python(python: str) -> tuple[bool, str]:
    """(whether `python`'s torch sees a CUDA device, what it is or why not)."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                              timeout=180, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot be run: {type(exc).__name__}: {_short(str(exc))}"
    if done.returncode != 0:
        return False, f"torch is not importable there ({_last_line(done.stderr)})"
    info = json.loads(done.stdout.strip().splitlines()[-1])
    if info["available"]:
        return True, (f"torch {info['version']}, CUDA {info['cuda'] or info['hip']}, "
                      f"{info['count']} device(s)")
    if not info["cuda"] and not info["hip"]:
        return False, f"torch {info['version']} is a CPU build (no CUDA in it)"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return False, (f"torch {info['version']} has CUDA {info['cuda'] or info['hip']} but sees "
                   "no device" + (f" (CUDA_VISIBLE_DEVICES={hidden!r})" if hidden is not None
                                  else " (no driver, or no GPU)"))


def python_candidates() -> list[str]:
    """GPU_PYTHON when given (only it); else this Python, then python3 and python on
    PATH, then the checkout's .venv (`make demo`'s, whose torch is the CPU build)."""
    given = os.environ.get("GPU_PYTHON", "").strip()
    if given:
        return [shutil.which(given) or given]
    found = [sys.executable, shutil.which("python3"), shutil.which("python"),
             str(ROOT / ".venv" / "bin" / "python")]
    unique: list[str] = []
    for python in found:
        if python and os.path.exists(python) and os.path.abspath(python) not in unique:
            unique.append(os.path.abspath(python))
    return unique


def choose_python() -> tuple[str | None, list[str]]:
    """The first candidate whose torch sees a CUDA device, and a line per candidate
    tried (why each one before it could not be used)."""
    lines = []
    for python in python_candidates():
        usable, what = probe_python(python)
        lines.append(f"{python}: {what}")
        if usable:
            return python, lines
    return None, lines


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--requirements"]:
        print("\n".join(requirements()))
        return 0
    if args_list[:1] == ["--build-requirements"]:
        print("\n".join(build_requirements()))
        return 0
    if args_list[:1] == ["--sdpa-probe"]:
        print(json.dumps(sdpa_probe(args_list[1])))
        return 0
    if args_list[:1] == ["--install-only"]:
        # What a run of the check does where the server's packages are missing, alone.
        why = install_from_wheels()
        if why:
            print(f"gpu-check: {why}", file=sys.stderr)
        return 2 if why else 0
    fake = os.environ.get(FAKE_ENV, "") not in ("", "0")
    if not os.environ.get(CHOSEN_ENV):
        code = _under_chosen_python(args_list, fake=fake)
        if code is not None:
            return code
    if "--which-python" in args_list:
        print(os.environ.get(CHOSEN_ENV) or sys.executable)
        return 0
    missing = missing_packages()
    if missing and str(SITE) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        print(f"gpu-check: {', '.join(missing)} not importable here: installing from "
              f"{WHEELS.name}/ into {SITE}", file=sys.stderr)
        why = install_from_wheels()
        if why:
            print(f"gpu-check: {why}", file=sys.stderr)
            return 2
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([sys.executable, __file__, *args_list], env=env,
                              check=False).returncode
    if missing:
        print(f"gpu-check: {', '.join(missing)} still not importable from {SITE}",
              file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="the GPU to check (default cuda:0)")
    parser.add_argument("--workloads", nargs="+", default=STANDARD,
                        help="the standard suite's workloads to run (default all)")
    parser.add_argument("--variants", nargs="+",
                        help="only these variants in the variants row (default every one)")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep the documents, the database and the logs in DIR")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, metavar="SECONDS",
                        help="start no check after this many seconds (default "
                             f"{DEADLINE_S:.0f}; {FAKE_DEADLINE_SCALE:g} times that, and each "
                             f"check's own, with {FAKE_ENV}=1)")
    parser.add_argument("--which-python", action="store_true",
                        help="only say which Python the check runs under, and why")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(args.keep)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-check-")))
        check = Check(work, device=args.device, workloads=list(args.workloads), fake=fake,
                      variants=args.variants)
        started = time.monotonic()
        print(table([], f"numparity gpu-check on {args.device}" + (" (FAKE CUDA)" if fake
                                                                   else "")
                    + f", {sys.executable}"), flush=True)

        def on_row(row: Row) -> None:
            print(_line(row), flush=True)
            if args.json:  # as far as it got, should the check be stopped
                Path(args.json).write_text(json.dumps([r.__dict__ for r in rows_so_far + [row]],
                                                      indent=1, default=str))
            rows_so_far.append(row)

        rows_so_far: list[Row] = []
        scale = FAKE_DEADLINE_SCALE if fake else 1.0
        rows = run_checks(check, on_row=on_row, deadline_s=args.deadline * scale, scale=scale)
        failed = sum(r.status == "FAIL" for r in rows)
        print(f"{len(rows)} rows, {failed} FAIL, in {time.monotonic() - started:.0f} s",
              flush=True)
    return 1 if failed else 0


def _under_chosen_python(args_list: list[str], *, fake: bool) -> int | None:
    """Run the check under the Python whose torch has CUDA (None: this one is it);
    2 naming each Python tried and why it cannot be used when there is none."""
    if fake:
        given = os.environ.get("GPU_PYTHON", "").strip()
        chosen: str | None = shutil.which(given) or given if given else sys.executable
        lines: list[str] = []
    else:
        chosen, lines = choose_python()
    if chosen is None:
        print("gpu-check: no CUDA device here: no Python whose torch sees a GPU.\n"
              + "".join(f"  {line}\n" for line in lines)
              + f"Set GPU_PYTHON to the Python of the node's CUDA torch (make gpu-check "
              f"GPU_PYTHON=/path/to/python), or {FAKE_ENV}=1 for the dry run with a fake "
              "GPU.", file=sys.stderr)
        return 2
    for line in lines[:-1]:
        print(f"gpu-check: passed over {line}", file=sys.stderr)
    if lines:
        print(f"gpu-check: under {lines[-1]}", file=sys.stderr)
    if os.path.abspath(chosen) == os.path.abspath(sys.executable):
        return None
    env = {**os.environ, CHOSEN_ENV: chosen}
    return subprocess.run([chosen, __file__, *args_list], env=env, check=False).returncode


# ---- small helpers ---------------------------------------------------------------------


def _result(document: dict[str, Any] | None, workload: str, variant: str
            ) -> dict[str, Any] | None:
    if document is None:
        return None
    return next((r for r in document["results"]
                 if r["workload"] == workload and r["variant"] == variant), None)


def _cc(text: Any) -> tuple[int, int]:
    """"9.0" -> (9, 0); (0, 0) when unknown."""
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def _child_wall(document: dict[str, Any]) -> float:
    return sum(t["wall_s"] for t in document.get("timeline", []))


def _short(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return _short(lines[-1]) if lines else "(no output)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(base: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the embedded server exited with {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the embedded server was not ready after {timeout:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
