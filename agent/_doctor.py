"""`numparity-agent doctor`: the reproducibility checklist of this node (design §2.6).

Each check is a function of the environment document (the same capture as a run's,
so the doctor and the fleet see one node the same way) and of the process
environment; only the fp16 eps check computes something live. A check answers:

- `ok`;
- `warn`: the node's setup makes results differ or vary (an environment variable
  unset or set wrong, something that changes torch's defaults at start-up) and the
  node can fix it, the README's recipe (/etc/numparity/numeric.env) does; `--strict`
  fails on these only;
- `fact`: true of every fresh process (torch's defaults: deterministic algorithms
  off, TF32 convolutions on an Ampere GPU) or of a number format (fp16's range); no
  node setting changes it, the code that runs must handle it, so `--strict` passes.

The knobs read here are the defaults a fresh Python process gets on this node: what
user code changes at run time is invisible to the doctor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from numparity_agent import _cost
from numparity_agent._determinism import (
    OMP_DYNAMIC_CAUSE,
    comment_text,
    omp_dynamic,
    recipe_code,
)

Status = Literal["ok", "warn", "fact"]

# Values of CUBLAS_WORKSPACE_CONFIG that make cuBLAS deterministic (CUDA >= 10.2).
DETERMINISTIC_CUBLAS_WORKSPACES = (":4096:8", ":16:8")
# Compute capability from which tensor cores run fp32 matmuls/convolutions in TF32.
TF32_MIN_CC = (8, 0)
# The eps the design's `train` workload and torch.optim.Adam use by default.
ADAM_EPS = 1e-8
# Where the README's recipe keeps the node's numeric settings (deploy/numeric.env).
NUMERIC_ENV_FILE = "/etc/numparity/numeric.env"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str | None = None


def _check_seeds(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    agent = (
        "the agent seeds its strict variant itself (random, numpy, torch) and builds "
        "inputs from its own portable generator, so its results do not depend on seeds"
    )
    fix = (
        "in training code seed every generator once at start: random.seed(s); "
        "numpy.random.seed(s); torch.manual_seed(s) (seeds the CPU and every CUDA "
        f"device); and PYTHONHASHSEED=0 in the environment ({NUMERIC_ENV_FILE})"
    )
    seed = environ.get("PYTHONHASHSEED")
    if not seed or seed == "random":  # Python reads an empty value as unset
        return Check(
            "seeds",
            "warn",
            f"{agent}; user code is not: PYTHONHASHSEED is unset, so the iteration "
            "order of sets of strings (and anything built from it) changes every run",
            fix,
        )
    return Check(
        "seeds",
        "ok",
        f"{agent}; PYTHONHASHSEED={seed} fixes string hashing; user code must still "
        "seed random, numpy and torch itself",
        fix,
    )


def _check_deterministic_algorithms(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    knobs = env.get("knobs", {})
    state = knobs.get("deterministic_algorithms")
    fix = (
        "torch.use_deterministic_algorithms(True) at the start of the program "
        "(on CUDA with CUBLAS_WORKSPACE_CONFIG=:4096:8); ops without a deterministic "
        "implementation then raise instead of varying silently"
    )
    if state is None:
        reason = env.get("unknown", {}).get("knobs.deterministic_algorithms", "not recorded")
        return Check("deterministic_algorithms", "fact", f"cannot be read: {reason}", fix)
    if not state:
        # A setting of the process, not of the node: no environment variable turns it
        # on, so every fresh process starts with it off and only code can change that.
        return Check(
            "deterministic_algorithms",
            "fact",
            "off in every fresh process (torch's default; only code turns it on): "
            "index_add_, scatter_add_, some backward passes and cuDNN algorithms may "
            "use atomics whose order changes between runs",
            fix,
        )
    if knobs.get("deterministic_warn_only"):
        return Check(
            "deterministic_algorithms",
            "warn",
            "a fresh process on this node starts in warn-only mode (something run at "
            "start-up, a sitecustomize or .pth file, sets it): nondeterministic ops "
            "only print a warning",
            "remove that start-up code, or call "
            "torch.use_deterministic_algorithms(True, warn_only=False)",
        )
    return Check("deterministic_algorithms", "ok", "on")


def _check_cudnn(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    knobs = env.get("knobs", {})
    cuda_node = bool(env.get("gpus"))
    if knobs.get("cudnn.benchmark"):
        # torch's default is off: in a fresh process it is on only if the node's
        # start-up code (a sitecustomize or .pth file) turned it on.
        return Check(
            "cudnn",
            "warn",
            "cudnn.benchmark is on in a fresh process on this node (torch's default is "
            "off: start-up code, a sitecustomize or .pth file, sets it): cuDNN times "
            "several convolution algorithms and keeps the fastest, which can differ "
            "from run to run and node to node",
            "remove that start-up code; in code: torch.backends.cudnn.benchmark = False",
        )
    if cuda_node and knobs.get("cudnn.enabled") and not knobs.get("cudnn.deterministic"):
        return Check(
            "cudnn",
            "fact",
            "cudnn.deterministic is off in every fresh process (torch's default): cuDNN "
            "may pick nondeterministic kernels",
            "torch.backends.cudnn.deterministic = True",
        )
    if not cuda_node:
        return Check("cudnn", "ok", "cudnn.benchmark off; no GPU, so no cuDNN kernels run")
    return Check("cudnn", "ok", "cudnn.benchmark off and cudnn.deterministic on")


def _resolve_tf32(knobs: Mapping[str, Any], chain: list[str], legacy: str) -> bool | None:
    """Whether fp32 runs in a reduced format, from the fp32_precision tree or legacy flag.

    The tree is read leaf first: 'none' means "inherit from the parent". When the
    whole chain says 'none' the legacy flag decides (it is what torch consults then).
    None when neither can be read (mixed APIs make the legacy getter raise).
    """
    for name in chain:
        value = knobs.get(name)
        if value in ("tf32", "bf16"):
            return True
        if value == "ieee":
            return False
    value = knobs.get(legacy)
    return value if isinstance(value, bool) else None


def tf32_in_force(knobs: Mapping[str, Any]) -> dict[str, bool | None]:
    """{"matmul": ..., "conv": ...}: whether CUDA fp32 matmuls / convolutions use TF32."""
    matmul = _resolve_tf32(
        knobs, ["cuda.matmul.fp32_precision", "fp32_precision"], "cuda.matmul.allow_tf32"
    )
    if matmul is False and knobs.get("float32_matmul_precision") in ("high", "medium"):
        matmul = True
    conv = _resolve_tf32(
        knobs,
        ["cudnn.conv.fp32_precision", "cudnn.fp32_precision", "fp32_precision"],
        "cudnn.allow_tf32",
    )
    return {"matmul": matmul, "conv": conv}


def _cc(gpu: Mapping[str, Any]) -> tuple[int, int] | None:
    try:
        major, minor = str(gpu["compute_capability"]).split(".")
        return int(major), int(minor)
    except (KeyError, ValueError):
        return None


def _check_tf32(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    knobs = env.get("knobs", {})
    env_vars = env.get("env_vars", {})
    gpus = env.get("gpus", [])
    override = env_vars.get("NVIDIA_TF32_OVERRIDE")
    if override is not None:
        return Check(
            "tf32",
            "warn",
            f"NVIDIA_TF32_OVERRIDE={override} overrides the framework's TF32 flags for "
            "every process on this node (cuBLAS/cuDNN read it), so this node computes "
            "differently from peers configured only in code",
            "unset NVIDIA_TF32_OVERRIDE and choose TF32 in code "
            "(torch.backends.cuda.matmul.fp32_precision / cudnn.conv.fp32_precision)",
        )
    if gpus:
        state = tf32_in_force(knobs)
        on = [op for op in ("matmul", "conv") if state[op]]
        unreadable = [op for op in ("matmul", "conv") if state[op] is None]
        ampere = [g for g in gpus if (_cc(g) or (0, 0)) >= TF32_MIN_CC]
        names = ", ".join(
            f"cuda:{g.get('index')} {g.get('name')} (cc {g.get('compute_capability')})"
            for g in ampere
        )
        fix = (
            'torch.backends.cuda.matmul.fp32_precision = "ieee"; '
            'torch.backends.cudnn.conv.fp32_precision = "ieee" '
            "(torch < 2.9: torch.backends.cuda.matmul.allow_tf32 = False; "
            "torch.backends.cudnn.allow_tf32 = False)"
        )
        if ampere and on:
            effect = (
                f"TF32 is on for fp32 {' and '.join(on)} and {names} has tensor cores "
                "that use it: fp32 results carry a 10-bit mantissa (~1e-3 relative "
                "error) and differ from older GPUs and from the CPU"
            )
            if "matmul" in on:
                # torch's default is IEEE fp32 for matmuls: TF32 there in a fresh
                # process comes from the node (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 or
                # start-up code).
                return Check(
                    "tf32",
                    "warn",
                    f"{effect}; TF32 matmuls are not torch's default, so something on "
                    "this node (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, a sitecustomize or "
                    ".pth file) turns them on",
                    f"unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE or remove that start-up "
                    f"code; in code: {fix}",
                )
            return Check("tf32", "fact", f"{effect}; TF32 convolutions are torch's "
                         "default in every fresh process: only code turns them off", fix)
        if ampere and unreadable:
            return Check(
                "tf32",
                "warn",
                f"cannot tell whether TF32 is on for {' and '.join(unreadable)} on {names} "
                "(the legacy and new TF32 APIs were mixed)",
                fix,
            )
        if ampere:
            return Check("tf32", "ok", f"TF32 off for matmul and conv on {names}")
        return Check(
            "tf32",
            "ok",
            "no GPU of compute capability 8.0 or newer: TF32 does not exist on "
            + ", ".join(f"{g.get('name')} (cc {g.get('compute_capability')})" for g in gpus),
        )
    return _check_cpu_reduced_fp32(env)


def _check_cpu_reduced_fp32(env: Mapping[str, Any]) -> Check:
    """On a CPU node the analogue of TF32: oneDNN computing fp32 matmuls in bf16 (AMX)."""
    knobs = env.get("knobs", {})
    flags = set(str((env.get("cpu") or {}).get("flags") or "").split())
    precision = knobs.get("float32_matmul_precision")
    reduced = _resolve_tf32(
        knobs, ["mkldnn.matmul.fp32_precision", "mkldnn.fp32_precision", "fp32_precision"], ""
    )
    amx = "amx_bf16" in flags
    fix = 'torch.set_float32_matmul_precision("highest") (or mkldnn.matmul.fp32_precision = "ieee")'
    if amx and (precision in ("high", "medium") or reduced):
        # torch's default is 'highest': a reduced precision in a fresh process was set
        # by the node's start-up code.
        return Check(
            "tf32",
            "warn",
            f"no GPU; this CPU has AMX and float32_matmul_precision is {precision!r} in "
            "a fresh process (torch's default is 'highest': start-up code, a "
            "sitecustomize or .pth file, sets it): oneDNN computes fp32 matmuls in "
            "bf16 (the CPU analogue of TF32, ~1e-3 relative error) and differs from "
            "CPUs without AMX",
            f"remove that start-up code; in code: {fix}",
        )
    if amx:
        return Check(
            "tf32",
            "ok",
            "no GPU; float32_matmul_precision is 'highest': fp32 matmuls in full "
            "precision (on this AMX CPU 'medium'/'high' would compute them in bf16, "
            "the CPU analogue of TF32)",
        )
    return Check("tf32", "ok", "no GPU and no AMX: fp32 matmuls run in full precision")


def _check_cublas_workspace(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    value = env.get("env_vars", {}).get("CUBLAS_WORKSPACE_CONFIG")
    fix = f"CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment ({NUMERIC_ENV_FILE})"
    if not env.get("gpus"):
        return Check("cublas_workspace", "ok", "no GPU: cuBLAS is not used")
    if value is None:
        return Check(
            "cublas_workspace",
            "warn",
            "CUBLAS_WORKSPACE_CONFIG is unset on a CUDA node: cuBLAS may split "
            "reductions across streams nondeterministically (and deterministic "
            "algorithms raise on matmuls)",
            fix,
        )
    if value not in DETERMINISTIC_CUBLAS_WORKSPACES:
        return Check(
            "cublas_workspace",
            "warn",
            f"CUBLAS_WORKSPACE_CONFIG={value} is not one of the deterministic settings "
            f"{' or '.join(DETERMINISTIC_CUBLAS_WORKSPACES)}",
            fix,
        )
    return Check("cublas_workspace", "ok", f"CUBLAS_WORKSPACE_CONFIG={value}")


def _check_threads(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    env_vars = env.get("env_vars", {})
    threads = (env.get("threads") or {}).get("num_threads")
    cpus = (env.get("cpu") or {}).get("logical_cpus")
    pinned = {k: env_vars[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in env_vars}
    if omp_dynamic(env_vars):
        # Design §2.13: what made `train` nondeterministic on a loaded CPU.
        return Check("threads", "warn", OMP_DYNAMIC_CAUSE.split(": unset")[0],
                     f"unset OMP_DYNAMIC, or OMP_DYNAMIC=false ({NUMERIC_ENV_FILE})")
    if pinned:
        settings = ", ".join(f"{k}={v}" for k, v in pinned.items())
        # torch's intra-op threads follow OMP_NUM_THREADS (MKL's, MKL_NUM_THREADS).
        configured = str(pinned.get("OMP_NUM_THREADS", pinned.get("MKL_NUM_THREADS"))).strip()
        if configured.isdigit() and isinstance(threads, int) and threads != int(configured):
            return Check(
                "threads", "warn",
                f"{settings}, but torch uses {threads} thread(s): the configured count is "
                "not the one this process computes with (torch.set_num_threads in code, "
                "or a launcher that sets its own), so its CPU reductions split another "
                "way than on the nodes where the setting holds",
                f"find what sets torch's threads here, or set OMP_NUM_THREADS to what "
                f"every node runs with ({NUMERIC_ENV_FILE}; {cpus} logical CPUs here)")
        return Check("threads", "ok", f"{settings}: torch uses {threads} thread(s)")
    return Check(
        "threads",
        "warn",
        f"OMP_NUM_THREADS and MKL_NUM_THREADS are unset: torch uses {threads} thread(s) "
        f"because this machine has {cpus} logical CPUs; CPU reductions are split by "
        "thread, so a machine with another core count sums in another order",
        f"OMP_NUM_THREADS and MKL_NUM_THREADS in the environment, the same number on "
        f"every node ({NUMERIC_ENV_FILE}; {threads} here), or torch.set_num_threads(N) "
        "in code",
    )


def _check_mkl_cbwr(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    torch_doc = env.get("torch") or {}
    value = env.get("env_vars", {}).get("MKL_CBWR")
    if not torch_doc.get("mkl_available"):
        return Check("mkl_cbwr", "ok", "torch is not built with MKL")
    fix = (
        f"MKL_CBWR=COMPATIBLE in the environment ({NUMERIC_ENV_FILE}; bitwise the same "
        "on every x86 CPU, slowest) or MKL_CBWR=AVX2 (the same on every CPU with AVX2)"
    )
    if value is None:
        return Check(
            "mkl_cbwr",
            "warn",
            "MKL_CBWR is unset on an MKL build: MKL picks its code path from the CPU "
            "it runs on (AVX-512, AVX2, ...), so BLAS results depend on the CPU model",
            fix,
        )
    if value.split(",")[0].strip().upper() in ("", "AUTO"):
        return Check(
            "mkl_cbwr",
            "warn",
            f"MKL_CBWR={value} is MKL's default: it still picks its code path from the "
            "CPU it runs on, so BLAS results depend on the CPU model",
            fix,
        )
    return Check("mkl_cbwr", "ok", f"MKL_CBWR={value}: MKL's code path is fixed")


def _check_dataloader(env: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    return pipeline_check(None)


def pipeline_check(pipeline: str | None) -> Check:
    """Whether a DataLoader on this node needs the seeds' recipe, measured with real
    workers (`_data_doctor`): the built-in `data` pipeline, or a lab's `module:factory`."""
    from numparity_agent._data_doctor import RECIPE_CODE, measure

    name = "dataloader_workers" if pipeline is None else f"pipeline {pipeline}"
    try:
        status, message = measure(pipeline)
    except Exception as exc:  # noqa: BLE001 - the checklist goes on; the reason is shown
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Check(name, "warn", f"could not be measured ({type(exc).__name__}: {reason}); "
                     "DataLoader workers draw their own seeds, so the recipe is needed "
                     "unless a measurement shows otherwise", RECIPE_CODE)
    return Check(name, status, message, RECIPE_CODE)


def fp16_underflows(eps: float = ADAM_EPS) -> bool:
    """Whether `eps` rounds to zero in float16 (computed by torch, not assumed)."""
    import torch

    return bool(torch.tensor(eps, dtype=torch.float16) == 0)


def _check_fp16_eps(
    env: Mapping[str, Any], environ: Mapping[str, str], eps: float = ADAM_EPS
) -> Check:
    if fp16_underflows(eps):
        return Check(
            "fp16_eps",
            "fact",
            f"eps={eps:g} (LayerNorm, Adam) rounds to 0 in float16, on every node (the "
            "format's smallest subnormal is 6e-8): in pure fp16 the division by sqrt(var)+eps can "
            "produce inf/NaN",
            "keep eps and optimizer state in float32 (autocast and AMP do; never "
            "model.half() with Adam), or use eps >= 1e-4 when a tensor must be fp16",
        )
    return Check("fp16_eps", "ok", f"eps={eps:g} is representable in float16")


CHECKS: list[Callable[[Mapping[str, Any], Mapping[str, str]], Check]] = [
    _check_seeds,
    _check_deterministic_algorithms,
    _check_cudnn,
    _check_tf32,
    _check_cublas_workspace,
    _check_threads,
    _check_mkl_cbwr,
    _check_dataloader,
    _check_fp16_eps,
]


def diagnose(
    *, environment: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
    pipeline: str | None = None,
) -> list[Check]:
    """The checklist for `environment` (default: captured now) and `environ`; with
    `pipeline` (`module:factory`), that DataLoader measured too."""
    if environment is None:
        from numparity_agent._environment import capture_environment

        environment = capture_environment()
    environ = os.environ if environ is None else environ
    checks = [check(environment, environ) for check in CHECKS]
    if pipeline is not None:
        checks.append(pipeline_check(pipeline))
    return checks


def as_json(checks: list[Check]) -> dict[str, Any]:
    return {
        "checks": [asdict(c) for c in checks],
        "warnings": sum(c.status == "warn" for c in checks),
        "facts": sum(c.status == "fact" for c in checks),
    }


def render(checks: list[Check], environment: Mapping[str, Any]) -> str:
    torch_doc = environment.get("torch") or {}
    gpus = environment.get("gpus") or []
    devices = ", ".join(str(g.get("name")) for g in gpus) or "no GPU"
    lines = [
        f"numparity doctor: torch {torch_doc.get('version')}, "
        f"CPU {(environment.get('cpu') or {}).get('capability')}, {devices}",
        "(defaults of a fresh Python process on this node; what your code sets at run "
        "time is not visible here)",
        "warn: this node's setup, fix it on the node (--strict fails); "
        "fact: true of every process or of the format, handle it in code",
        "",
    ]
    for check in checks:
        lines.append(f"[{check.status:<4}] {check.name}: {check.message}")
        if check.fix and check.status == "warn":
            lines.append(f"       fix: {check.fix}")
        elif check.fix and check.status == "fact":
            lines.append(f"       in code: {check.fix}")
    warnings = sum(c.status == "warn" for c in checks)
    facts = sum(c.status == "fact" for c in checks)
    lines += ["", f"{warnings} warning(s) to fix on this node, {facts} fact(s) to handle "
                  f"in code, {len(checks)} check(s)"]
    return "\n".join(lines)


def selective_recipes(document: Mapping[str, Any]) -> str:
    """`doctor --recipe FILE`: for each nondeterministic result of a run document (`run
    --trace-ops --repeats 2 --output FILE`, design §2.13), the code that makes only its
    named ops deterministic, ready to paste after the model is built; or why there is
    none."""
    blocks = []
    for result in document.get("results") or []:
        study = result.get("nondeterminism")
        if not study:
            continue
        head = comment_text(f"{result.get('workload')} / {result.get('variant')} on "
                            f"{result.get('device')}")
        ops = study.get("ops") or []
        sources = study.get("sources") or []
        if sources:
            blocks.append("\n".join(
                [f"# {head}: the difference enters from outside torch's ops"]
                + [comment_text(f"# at {s['op']} in {s.get('module') or 'the model'}"
                                + (f" ({s['at']})" if s.get("at") else "")
                                + f": {s.get('what', '')}; {s.get('advice', '')}")
                   for s in sources]) + "\n")
        if not ops:
            if sources:
                continue
            why = study.get("note") or study.get("error") or study.get("hint") or "no op named"
            blocks.append(f"# {head}: nondeterministic; {comment_text(why)}\n")
            continue
        cost = study.get("cost") or {}
        measured = ", ".join(
            f"{mode} {cost[mode]['wall_s']:.6f} s"
            + ("" if cost[mode].get("repeatable") else " (not repeatable)")
            for mode in ("default", "strict", "selective") if mode in cost)
        lines = [f"# {head}: measured {measured}" if measured else f"# {head}"]
        # The cost in the audit's words (`_cost.words`: the same rule and figures).
        costs = [f"{mode}: {_cost.words(cost[mode], load=cost.get('load'))}"
                 for mode in ("selective", "strict") if cost.get(mode, {}).get("ratio")
                 is not None]
        if costs:
            lines.append(comment_text(f"# cost against default: {'; '.join(costs)}"))
        if study.get("cause"):
            lines.append(f"# {comment_text(study['cause'])}")
        blocks.append("\n".join(lines) + "\n" + recipe_code(ops, workload=str(
            result.get("workload"))))
    if not blocks:
        return ("# no result of this run document is nondeterministic: nothing to make "
                "deterministic\n")
    return "\n".join(blocks)
