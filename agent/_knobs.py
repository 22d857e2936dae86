"""The numeric knobs of design §2.3: read the values in force, set the strict ones.

torch 2.9 added the `fp32_precision` tree (torch.backends.fp32_precision,
torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
...). Once it has been used, the legacy getters (`allow_tf32`) raise, so the tree is
read first and every legacy getter is guarded. Older torch (>= 2.1) has only the
legacy ones. Nothing here imports torch at module level.
"""

from __future__ import annotations

import os
from typing import Any

# (knob name, attribute path below torch.backends) of the fp32_precision tree.
_FP32_PRECISION = [
    ("fp32_precision", ""),
    ("cuda.matmul.fp32_precision", "cuda.matmul"),
    ("cudnn.fp32_precision", "cudnn"),
    ("cudnn.conv.fp32_precision", "cudnn.conv"),
    ("cudnn.rnn.fp32_precision", "cudnn.rnn"),
    ("mkldnn.fp32_precision", "mkldnn"),
    ("mkldnn.matmul.fp32_precision", "mkldnn.matmul"),
    ("mkldnn.conv.fp32_precision", "mkldnn.conv"),
    ("mkldnn.rnn.fp32_precision", "mkldnn.rnn"),
]

_LEGACY = [
    ("cuda.matmul.allow_tf32", "cuda.matmul", "allow_tf32"),
    ("cudnn.allow_tf32", "cudnn", "allow_tf32"),
    (
        "cuda.matmul.allow_fp16_reduced_precision_reduction",
        "cuda.matmul",
        "allow_fp16_reduced_precision_reduction",
    ),
    (
        "cuda.matmul.allow_bf16_reduced_precision_reduction",
        "cuda.matmul",
        "allow_bf16_reduced_precision_reduction",
    ),
    ("cuda.matmul.allow_fp16_accumulation", "cuda.matmul", "allow_fp16_accumulation"),
    ("cudnn.enabled", "cudnn", "enabled"),
    ("cudnn.benchmark", "cudnn", "benchmark"),
    ("cudnn.deterministic", "cudnn", "deterministic"),
    ("mkldnn.enabled", "mkldnn", "enabled"),
    ("mkldnn.deterministic", "mkldnn", "deterministic"),
    # opt_einsum picks the contraction order of torch.einsum, hence the rounding.
    ("opt_einsum.enabled", "opt_einsum", "enabled"),
]

# Knobs read by calling a getter below torch.backends: the SDPA backends that
# scaled_dot_product_attention may choose (each computes softmax differently), and
# the BLAS / linear algebra library preferred on CUDA (cuBLAS vs cuBLASLt, ...).
_GETTERS = [
    ("cuda.flash_sdp_enabled", "cuda", "flash_sdp_enabled"),
    ("cuda.mem_efficient_sdp_enabled", "cuda", "mem_efficient_sdp_enabled"),
    ("cuda.math_sdp_enabled", "cuda", "math_sdp_enabled"),
    ("cuda.cudnn_sdp_enabled", "cuda", "cudnn_sdp_enabled"),
    (
        "cuda.fp16_bf16_reduction_math_sdp_allowed",
        "cuda",
        "fp16_bf16_reduction_math_sdp_allowed",
    ),
    ("cuda.preferred_blas_library", "cuda", "preferred_blas_library"),
    ("cuda.preferred_linalg_library", "cuda", "preferred_linalg_library"),
]

# NCCL_*: NCCL's algorithm, protocol, channels and NVLink SHARP (NVLS, on NVSwitch
# systems) decide a collective's reduction order, hence its rounding.
NUMERIC_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "PYTORCH_", "NCCL_")
NUMERIC_ENV_NAMES = (
    "CUBLAS_WORKSPACE_CONFIG",
    "ATEN_CPU_CAPABILITY",
    "NVIDIA_TF32_OVERRIDE",
    # Inductor's settings that change what the compiled variant computes (design §2.14);
    # not TORCHINDUCTOR_* as a whole: its cache folders say nothing of the numbers.
    "TORCHINDUCTOR_EMULATE_PRECISION_CASTS",
    "TORCHINDUCTOR_EMULATE_PRECISION_CASTS_ON_SAVED_TENSORS",
    "TORCHINDUCTOR_MAX_AUTOTUNE",
    "TORCHINDUCTOR_BATCH_INVARIANT",
    "TORCHINDUCTOR_DETERMINISTIC",
)
# Where NCCL writes what it logs: never what it computes.
_NCCL_LOGGING = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE",
                           "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_TOPO_DUMP_FILE",
                           "NCCL_GRAPH_DUMP_FILE"})
# Which devices a process sees is a scheduler's choice (Slurm's gres, Kubernetes' device
# plugin), not arithmetic: under a scheduler each allocation (`0`, `1`, `1,2`) would be
# an environment of its own, and identical nodes would have no peers. The devices a run
# measured are named by UUID and slot in the run document (`devices`), never here.
DEVICE_SELECTION_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                    "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
                                    "NVIDIA_VISIBLE_DEVICES"})
DEVICE_SELECTION_PREFIXES = ("SLURM_",)


def numeric_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables that change numerics and are set (sorted by name);
    never one that selects devices (DEVICE_SELECTION_NAMES)."""
    environ = dict(os.environ if environ is None else environ)
    return {
        k: v
        for k, v in sorted(environ.items())
        if (k in NUMERIC_ENV_NAMES or k.startswith(NUMERIC_ENV_PREFIXES))
        and k not in DEVICE_SELECTION_NAMES and not k.startswith(DEVICE_SELECTION_PREFIXES)
        and k not in _NCCL_LOGGING
    }


def _backend(path: str) -> Any:
    import torch

    obj: Any = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    name = getattr(value, "name", None)  # enums such as _BlasBackend.Cublas -> "Cublas"
    return name if isinstance(name, str) else str(value)


def read_knobs(unknown: dict[str, str] | None = None) -> dict[str, Any]:
    """Every numeric knob with the value in force in this process.

    A knob this torch does not have is left out; one that exists but cannot be read
    goes into `unknown` with the reason.
    """
    import torch

    knobs: dict[str, Any] = {}

    def note(name: str, exc: BaseException) -> None:
        if unknown is not None:
            unknown[f"knobs.{name}"] = f"{type(exc).__name__}: {exc}"

    for name, path in _FP32_PRECISION:
        try:
            backend = _backend(path)
        except AttributeError:
            continue
        if not hasattr(type(backend), "fp32_precision") and not hasattr(backend, "fp32_precision"):
            continue
        try:
            knobs[name] = _plain(backend.fp32_precision)
        except Exception as exc:  # noqa: BLE001 - any failure is recorded, never guessed
            note(name, exc)
    for name, path, attr in _LEGACY:
        try:
            backend = _backend(path)
        except AttributeError:
            continue
        try:
            if not hasattr(backend, attr):
                continue
            knobs[name] = _plain(getattr(backend, attr))
        except Exception as exc:  # noqa: BLE001 - legacy getters raise when APIs are mixed
            note(name, exc)
    for name, path, attr in _GETTERS:
        try:
            getter = getattr(_backend(path), attr)
        except AttributeError:
            continue
        try:
            knobs[name] = _plain(getter())
        except Exception as exc:  # noqa: BLE001
            note(name, exc)
    top_level = [
        # Raises like the legacy getters once the fp32_precision tree has been mixed in.
        ("float32_matmul_precision", torch.get_float32_matmul_precision),
        ("deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
        (
            "deterministic_warn_only",
            getattr(torch, "is_deterministic_algorithms_warn_only_enabled", None),
        ),
        ("num_threads", torch.get_num_threads),
        ("num_interop_threads", torch.get_num_interop_threads),
    ]
    for name, read in top_level:
        if read is None:
            continue
        try:
            knobs[name] = _plain(read())
        except Exception as exc:  # noqa: BLE001
            note(name, exc)
    knobs["CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    return knobs


def disable_tf32() -> None:
    """fp32 matmuls and convolutions in full IEEE precision on every backend."""
    import torch

    backends = torch.backends
    if hasattr(backends, "fp32_precision"):
        # The new API only: setting a legacy flag as well would make getters raise.
        for _name, path in _FP32_PRECISION[1:]:
            try:
                backend = _backend(path)
            except AttributeError:
                continue
            if hasattr(backend, "fp32_precision"):
                backend.fp32_precision = "ieee"
        backends.fp32_precision = "ieee"
    else:
        backends.cuda.matmul.allow_tf32 = False
        backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
