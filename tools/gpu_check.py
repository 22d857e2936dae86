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
import socket
import subprocess
import sys
import tempfile
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
              timeout: float = 3600, upload: bool = True) -> subprocess.CompletedProcess[str]:
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
                              timeout=timeout, check=False)
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

        response = httpx.get(f"{self.server}/api/v1{path}", params=params, timeout=120,
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
                          env=check.agent_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        return Row("identity", "FAIL", f"listing the devices failed: {_last_line(done.stderr)}")
    devices = json.loads(done.stdout)
    mine = next((d for d in devices if d.get("device") == check.device), None)
    if mine is None:
        return Row("identity", "FAIL", f"{check.device} is not among "
                   f"{', '.join(d.get('device', '?') for d in devices) or 'no devices'}")
    fields = ("uuid", "serial", "pci_bus_id", "name", "compute_capability")
    missing = [f for f in fields if not mine.get(f)]
    detail = (f"{mine.get('name')}, cc {mine.get('compute_capability')}, {mine.get('uuid')}, "
              f"serial {mine.get('serial')}, PCI {mine.get('pci_bus_id')}")
    if missing:
        return Row("identity", "FAIL", f"{detail}; missing: {', '.join(missing)}", mine)
    return Row("identity", "ok", detail, mine)


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


def check_tf32_split(check: Check) -> list[Row]:
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


def check_sdpa(check: Check) -> Row:
    decoder = _result(check.documents.get("stock"), "decoder", "default")
    if decoder is None:
        return Row("SDPA backends", "n/a", "decoder not in this check's workloads")
    if decoder["status"] != "ok":
        return Row("SDPA backends", "FAIL", f"decoder {decoder['status']}: "
                   f"{_short(decoder.get('error') or decoder.get('reason', ''))}")
    backends = [t["name"].removeprefix("sdpa.") for t in decoder["tensors"]
                if t["name"].startswith("sdpa.")]
    agree = decoder.get("checks", {}).get("attention_backends_agree", {})
    detail = f"ran {', '.join(backends) or 'none'}; agree with math: {agree.get('equal')}"
    if agree.get("op"):
        detail += f" (first differing: {agree['op']})"
    # On a GPU flash and efficient attention run (cuDNN where this build has it).
    wanted = {"math"} if check.fake else {"math", "flash", "efficient"}
    missing = wanted - set(backends)
    return Row("SDPA backends", "FAIL" if missing else "ok",
               detail + (f"; missing {', '.join(sorted(missing))}" if missing else ""),
               {"backends": backends})


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


def check_kernel_names(check: Check) -> Row:
    """`--trace-ops` on the device: kernel names on GEMMs and convolutions, and the cost
    (the default variant's child, traced over untraced)."""
    workloads = [w for w in check.workloads if w != "collectives"]
    plain, error = check.run_document("untraced", "--workloads", *workloads, "--variants",
                                      "default", node="gpu-check-trace", upload=False)
    traced, error_traced = check.run_document("traced", "--workloads", *workloads,
                                              "--variants", "default", "--trace-ops",
                                              node="gpu-check-trace", upload=False)
    if plain is None or traced is None:
        return Row("profiler kernel names", "FAIL", error or error_traced)
    ratio = _child_wall(traced) / max(_child_wall(plain), 1e-9)
    ops = [op for body in traced.get("traces", []) for op in body["ops"]]
    named = [op for op in ops if op.get("kernel") and not
             op["kernel"].startswith(("conv:", "sdpa:")) or "; " in op.get("kernel", "")]
    errors = [r["trace_error"] for r in traced["results"] if r.get("trace_error")]
    examples = sorted({op["kernel"].split("; ")[-1] for op in named})[:2]
    detail = (f"{len(named)} of {len(ops)} ops name CUDA kernels ({'; '.join(examples) or '-'});"
              f" traced/untraced {ratio:.2f}x (target {TARGET_TRACE_RATIO}x)")
    if errors:
        detail += f"; trace_error: {_short(errors[0])}"
    data = {"ratio": ratio, "named": len(named)}
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


# ---- the table ---------------------------------------------------------------------------


def run_checks(check: Check) -> list[Row]:
    rows = [check_identity(check)]
    with check.embedded_server():
        rows += check_variants(check)
        split_rows = check_tf32_split(check)
        rows += split_rows
        rows.append(check_explain(check, split_rows[0].data))
        rows.append(check_sdpa(check))
        rows.append(check_collectives(check))
        rows.append(check_kernel_names(check))
        rows.append(check_large_upload(check))
    rows.append(check_isclose(check))
    return rows


def table(rows: list[Row], header: str) -> str:
    width = max(len(r.check) for r in rows)
    lines = [header, f"{'check':<{width}}  status  detail", f"{'-' * width}  ------  ------"]
    lines += [f"{r.check:<{width}}  {r.status:<6}  {r.detail}" for r in rows]
    return "\n".join(lines)


# What the check imports beyond torch: the agent and the server from this checkout, and
# the server's libraries (pyproject.toml's `server` extra).
NEEDED = ("numparity_agent", "numparity_server", "numpy", "httpx", "fastapi", "uvicorn",
          "sqlalchemy", "alembic", "pydantic", "pydantic_settings", "jinja2",
          "prometheus_client", "orjson", "multipart")
WHEELS = Path(os.environ.get("NUMPARITY_GPU_CHECK_WHEELS") or ROOT / "wheels")
SITE = ROOT / ".gpu-check" / "site"


def requirements() -> list[str]:
    """What `make wheels` downloads and the install from wheels puts in SITE: the
    server's extra and the agent's httpx (numpy stays the node's: torch's numpy)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    agent = [r for r in project["optional-dependencies"]["agent"] if not r.startswith("numpy")]
    return [*agent, *project["optional-dependencies"]["server"]]


def missing_packages() -> list[str]:
    import importlib.util

    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a broken package
            return False

    return [name for name in NEEDED if not found(name)]


def install_from_wheels() -> str:
    """Install the server's packages from WHEELS and the checkout itself into SITE, with
    no index (`make wheels` fetched them on a machine with network). '' when done, else
    why not."""
    if not WHEELS.is_dir() or not any(WHEELS.glob("*.whl")):
        return (f"no {WHEELS.name}/ folder of wheels: run `make wheels` where there is "
                "network and bring the folder (docs/how-to/gpu-type.md)")
    requirements = WHEELS / "requirements.txt"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
           str(WHEELS), "--target", str(SITE), "--upgrade"]
    for step in ([*pip, "-r", str(requirements)], [*pip, "--no-deps", str(ROOT)]):
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"{' '.join(step[3:6])} … failed: {_last_line(done.stderr)}"
    return ""


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--requirements"]:
        print("\n".join(requirements()))
        return 0
    missing = missing_packages()
    if missing and str(SITE) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        print(f"gpu-check: {', '.join(missing)} not importable here: installing from "
              f"{WHEELS.name}/ into {SITE.relative_to(ROOT)}", file=sys.stderr)
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
    args = parser.parse_args(argv)
    fake = os.environ.get(FAKE_ENV, "") not in ("", "0")
    if not fake:
        try:
            import torch
        except ImportError:
            print("gpu-check: torch is not importable in this Python", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print(f"gpu-check: no CUDA device here (set {FAKE_ENV}=1 for the dry run with a "
                  "fake GPU)", file=sys.stderr)
            return 2
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(args.keep)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-check-")))
        check = Check(work, device=args.device, workloads=list(args.workloads), fake=fake,
                      variants=args.variants)
        started = time.monotonic()
        rows = run_checks(check)
        header = (f"numparity gpu-check on {args.device}" + (" (FAKE CUDA)" if fake else "")
                  + f", {time.monotonic() - started:.0f} s")
        print(table(rows, header))
        if args.json:
            Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1,
                                                  default=str))
    return 1 if any(r.status == "FAIL" for r in rows) else 0


# ---- small helpers ---------------------------------------------------------------------


def _result(document: dict[str, Any] | None, workload: str, variant: str
            ) -> dict[str, Any] | None:
    if document is None:
        return None
    return next((r for r in document["results"]
                 if r["workload"] == workload and r["variant"] == variant), None)


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
