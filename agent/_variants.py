"""Variants: the numeric configurations a workload runs under (design §2.3).

A variant acts at three moments, all in its own child process:
- `child_env`: environment variables that must be set before torch (or CUDA) starts;
- `skip_reason`: why it cannot run on this device (reported as skipped, never dropped);
- `apply`: knobs set once, before the workloads;
and a variant may wrap each run in a context (`run_context`, for autocast) and choose
the dtype workloads are built in (`dtype`, float64 for the reference) and the device
they run on (`target_device`: the reference is `cpu_only`, it always runs on the CPU,
so a run makes it once, not once per GPU). `knobs` adds what read_knobs cannot see
(autocast is a context, not a global flag) to each result.

Nothing here imports torch at module level: the parent process only validates names.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from typing import Any

STRICT_SEED = 0
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
# The variant `run --fault-drill` corrupts (design §2.6): the one a node must repeat
# bitwise, so the flipped bit is the only thing that tells the drill from a clean run.
FAULT_DRILL_VARIANT = "strict"


class Variant:
    name: str = ""
    dtype_name: str = "float32"
    # Runs on the CPU whatever device is asked for, and so once per run, not per device.
    cpu_only: bool = False
    # Needs a child process of its own: it sets an environment variable before torch
    # starts or a process-wide knob (`apply`). Variants that set neither share one child
    # per device (design §2.3): a child's start, torch's import and CUDA's initialisation
    # are most of a variant's cost on a GPU. True unless a variant says otherwise.
    own_process: bool = True
    # Compiles each workload's model with torch.compile (`_compile`, design §2.14): the
    # runner compiles, times the compile and localises where it parts from eager.
    compiles: bool = False

    def child_env(self, environ: dict[str, str]) -> dict[str, str]:
        return dict(environ)

    def skip_reason(self, device: Any) -> str | None:
        return None

    def apply(self, device: Any, *, threads: int) -> None:
        """Set this variant's knobs; `threads` is the node's configured thread count."""

    @contextlib.contextmanager
    def run_context(self, device: Any) -> Iterator[None]:
        yield

    def dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype_name)

    def target_device(self, device: Any) -> Any:
        """The device this variant runs on when `device` is requested."""
        if self.cpu_only:
            import torch

            return torch.device("cpu")
        return device

    def knobs(self, device: Any) -> dict[str, Any]:
        """Knobs in force that read_knobs cannot read from global state."""
        return {"autocast": None}


class Default(Variant):
    """The node's framework defaults, untouched."""

    name = "default"
    own_process = False


class Strict(Variant):
    """Seeds, deterministic algorithms, cuDNN benchmark off and deterministic, TF32 off,
    CUBLAS_WORKSPACE_CONFIG=:4096:8, explicit thread count."""

    name = "strict"

    def child_env(self, environ: dict[str, str]) -> dict[str, str]:
        # cuBLAS reads it when CUDA initialises: it must be in the environment at start.
        return {**environ, "CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE_CONFIG}

    def apply(self, device: Any, *, threads: int) -> None:
        import numpy as np
        import torch

        from numparity_agent._knobs import disable_tf32

        random.seed(STRICT_SEED)
        np.random.seed(STRICT_SEED)
        torch.manual_seed(STRICT_SEED)
        _use_deterministic_algorithms(torch)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        disable_tf32()
        torch.set_num_threads(threads)


def _use_deterministic_algorithms(torch: Any) -> None:
    """torch.use_deterministic_algorithms(True), without its 2.5 s import of inductor.

    The public function (torch >= 2.6) also imports torch._inductor.config to make
    compiled kernels deterministic, which pulls in dynamo. Only the opt-in `compiled`
    variant compiles (and it never runs with strict in one process), so the inductor
    flag is only set when inductor is already loaded.
    """
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None:
        torch.use_deterministic_algorithms(True)
        return
    set_flag(True, warn_only=False)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        setattr(inductor_config, "deterministic", True)  # noqa: B010 - a module attribute


class TF32(Variant):
    """TF32 for fp32 matmuls and convolutions on CUDA (Ampere and newer); on a CPU whose
    oneDNN has native bf16 (AMX or AVX512-BF16), its analogue (design §5): fp32 matmuls
    (and, with the fp32_precision tree of torch >= 2.9, convolutions) computed in bf16."""

    name = "tf32"

    def skip_reason(self, device: Any) -> str | None:
        import torch

        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            if major < 8:
                return (
                    "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer; "
                    f"{torch.cuda.get_device_name(device)} is {major}.{minor}"
                )
            return None
        if device.type == "cpu":
            return cpu_bf16_matmul_skip_reason()
        return f"TF32 is not defined for device type {device.type}"

    def apply(self, device: Any, *, threads: int) -> None:
        import torch

        backends: Any = torch.backends  # the fp32_precision tree is not in the stubs
        new_api = hasattr(backends, "fp32_precision")
        if device.type == "cuda":
            torch.set_float32_matmul_precision("high")
            if new_api:
                # Only the new API once it is in use: mixing makes legacy getters raise.
                backends.cuda.matmul.fp32_precision = "tf32"
                backends.cudnn.conv.fp32_precision = "tf32"
            else:
                backends.cuda.matmul.allow_tf32 = True
                backends.cudnn.allow_tf32 = True
            return
        torch.set_float32_matmul_precision("medium")
        mkldnn_conv = getattr(backends.mkldnn, "conv", None)
        if new_api and mkldnn_conv is not None:
            mkldnn_conv.fp32_precision = "bf16"


def cpu_flags() -> set[str] | None:
    """The CPU feature flags from /proc/cpuinfo (None where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def cpu_bf16_matmul_skip_reason() -> str | None:
    """Why oneDNN cannot compute fp32 matmuls in native bf16 here (None: it can)."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return "this torch has no oneDNN (mkldnn): no bf16 path for fp32 matmul on the CPU"
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if supported is not None and not supported():
        return "oneDNN reports no bf16 support on this CPU"
    flags = cpu_flags()
    if flags is None:
        return "cannot read the CPU flags to check for AMX-BF16 or AVX512-BF16"
    if not flags & {"amx_bf16", "avx512_bf16"}:
        return (
            "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer, and this CPU has "
            "no native bf16 (amx_bf16 or avx512_bf16) for its CPU analogue"
        )
    return None


class Autocast(Variant):
    autocast_dtype_name = "float16"
    own_process = False  # a context around each run, nothing process-wide

    def skip_reason(self, device: Any) -> str | None:
        import torch

        dtype = getattr(torch, self.autocast_dtype_name)
        if device.type == "cuda":
            if dtype == torch.bfloat16:
                major, _minor = torch.cuda.get_device_capability(device)
                if major < 8 and not torch.cuda.is_bf16_supported():
                    return f"{torch.cuda.get_device_name(device)} has no bfloat16"
            return None
        return _autocast_skip_reason(torch, device.type, dtype)

    @contextlib.contextmanager
    def run_context(self, device: Any) -> Iterator[None]:
        import torch

        with torch.autocast(device.type, dtype=getattr(torch, self.autocast_dtype_name)):
            yield

    def knobs(self, device: Any) -> dict[str, Any]:
        return {"autocast": self.autocast_dtype_name}


def _autocast_skip_reason(torch: Any, device_type: str, dtype: Any) -> str | None:
    """Try autocast on `device_type`: older torch warns and disables it for dtypes it
    does not support (CPU autocast had only bfloat16 before torch 2.4)."""
    import warnings

    name = str(dtype).removeprefix("torch.")
    available = getattr(torch.amp.autocast_mode, "is_autocast_available", None)
    if available is not None and not available(device_type):
        return f"torch {torch.__version__} has no autocast for {device_type}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device_type, dtype=dtype):
                a = torch.ones(2, 2, device=device_type)
                out_dtype = (a @ a).dtype
    except (RuntimeError, ValueError, AssertionError) as exc:
        return f"autocast {name} on {device_type} fails: {exc}"
    if out_dtype != dtype:
        return f"torch {torch.__version__} does not autocast to {name} on {device_type}"
    return None


class FP16Autocast(Autocast):
    """Autocast to float16 (CUDA; CPU where this torch supports it)."""

    name = "fp16-autocast"
    autocast_dtype_name = "float16"


class BF16Autocast(Autocast):
    """Autocast to bfloat16 (CPU; CUDA with bfloat16)."""

    name = "bf16-autocast"
    autocast_dtype_name = "bfloat16"


class FP64Reference(Variant):
    """The golden answer: every workload in float64 on the CPU. Workloads build their
    data in float32 from the generator and cast it up (exact), so the reference
    computes from the same numbers as the float32 variants."""

    name = "fp64-reference"
    dtype_name = "float64"
    cpu_only = True
    own_process = False


class Compiled(Variant):
    """Each workload's model through torch.compile (Inductor, default mode), everything
    else as `default`. Opt-in (`OPT_IN`): a cold compile takes minutes on a small CPU.
    A child of its own: Inductor's cache folder is an environment variable it reads when
    it loads (`_compile.cache_environ`, set by the parent), and its config is
    process-wide."""

    name = "compiled"
    compiles = True

    def skip_reason(self, device: Any) -> str | None:
        import torch

        from numparity_agent._compile import compile_reason

        return compile_reason(torch)

    def knobs(self, device: Any) -> dict[str, Any]:
        from numparity_agent._compile import inductor_knobs

        return {"autocast": None, "compile": "inductor", **inductor_knobs()}


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (Default(), Strict(), TF32(), FP16Autocast(), BF16Autocast(), FP64Reference(),
              Compiled())
}
# Variants a run makes only when named (`--variants`, config `variants`, a check plan).
OPT_IN = frozenset({Compiled.name})
COMPILED_VARIANT = Compiled.name


def process_groups(variants: list[str], environ: dict[str, str]) -> list[list[str]]:
    """`variants` in the child processes that run them, in order of each group's first
    member: every `own_process` variant alone, the others together when their child
    environments are the same (they are: none of them sets one)."""
    groups: list[list[str]] = []
    shared: dict[str, list[str]] = {}
    for name in variants:
        variant = get(name)
        if variant.own_process:
            groups.append([name])
            continue
        key = repr(sorted(variant.child_env(dict(environ)).items()))
        if key not in shared:
            shared[key] = []
            groups.append(shared[key])
        shared[key].append(name)
    return groups


def names() -> list[str]:
    return list(VARIANTS)


def get(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise KeyError(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)}") from None
