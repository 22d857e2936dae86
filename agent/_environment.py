"""The environment document (design §2.5, shape pinned in the interface notes).

Captured in-process. Anything that cannot be read is recorded under `unknown` with
the reason, never guessed. `env_key` is the sha256 of the canonical JSON of the
document without the identity keys (host name, GPU UUID and serial) and `unknown`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any

from numparity_agent._knobs import numeric_env_vars, read_knobs

IDENTITY_KEYS = frozenset({"env_key", "hostname", "uuid", "serial"})


ANONYMOUS_DEVICES_ENV = "NUMPARITY_ANONYMOUS_DEVICES"


def anonymous_devices() -> bool:
    """Whether this node reports its GPUs without UUID and serial (design §3.1): a second
    agent node on a machine whose GPUs another node already reports (a check run, a
    test) is then no claim on them; its GPUs count as one voter for it."""
    return os.environ.get(ANONYMOUS_DEVICES_ENV, "").strip().lower() in ("1", "true", "yes")


def without_identity(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``gpus`` (or devices) with their UUIDs and serials cleared when the node reports
    its devices anonymously; unchanged otherwise."""
    if anonymous_devices():
        for gpu in gpus:
            gpu["uuid"] = gpu["serial"] = None
    return gpus


def _strip_identity(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_identity(v)
            for k, v in value.items()
            if k not in IDENTITY_KEYS and k != "unknown"
        }
    if isinstance(value, list):
        return [_strip_identity(v) for v in value]
    return value


def compute_env_key(environment: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the environment without identity and `unknown`,
    its `gpus` as the set of GPU models this process saw: which GPUs and how many a
    scheduler exposed (`CUDA_VISIBLE_DEVICES=1` or `=0,1`) is not the environment, so
    neither a GPU's index nor the count is in the key."""
    stripped = _strip_identity(environment)
    gpus = stripped.get("gpus")
    if isinstance(gpus, list):
        models = {json.dumps({k: v for k, v in gpu.items() if k != "index"}, sort_keys=True,
                             separators=(",", ":"), default=str)
                  if isinstance(gpu, dict) else json.dumps(gpu, default=str) for gpu in gpus}
        stripped["gpus"] = sorted(models)
    canonical = json.dumps(stripped, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _read_cpuinfo(unknown: dict[str, str]) -> tuple[str | None, str | None]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        unknown["cpu.flags"] = f"/proc/cpuinfo unreadable: {exc}"
        model = platform.processor() or None
        if model is None:
            unknown["cpu.model"] = "no /proc/cpuinfo and platform.processor() is empty"
        return model, None
    model = flags = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if model is None and key in ("model name", "Model", "cpu model"):
            model = value.strip()
        elif flags is None and key in ("flags", "Features"):
            flags = " ".join(sorted(set(value.split())))
    if model is None:
        unknown["cpu.model"] = "no model name in /proc/cpuinfo"
    if flags is None:
        unknown["cpu.flags"] = "no flags in /proc/cpuinfo"
    return model, flags


def _cpu(unknown: dict[str, str]) -> dict[str, Any]:
    import torch

    model, flags = _read_cpuinfo(unknown)
    capability = None
    get_capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if get_capability is None:
        unknown["cpu.capability"] = "torch.backends.cpu.get_cpu_capability missing"
    else:
        try:
            capability = get_capability()
        except Exception as exc:  # noqa: BLE001
            unknown["cpu.capability"] = f"{type(exc).__name__}: {exc}"
    return {
        "model": model,
        "flags": flags,
        "logical_cpus": os.cpu_count(),
        "capability": capability,
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
    }


def _torch(unknown: dict[str, str]) -> dict[str, Any]:
    import torch

    doc: dict[str, Any] = {
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "config": None,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),  # ROCm builds: HIP instead of CUDA
        "cudnn": None,
        "nccl": None,
        "mkldnn_available": None,
        "mkl_available": None,
        "openmp_available": None,
    }
    try:
        doc["config"] = torch.__config__.show()
    except Exception as exc:  # noqa: BLE001
        unknown["torch.config"] = f"{type(exc).__name__}: {exc}"
    try:
        doc["cudnn"] = (
            torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        )
    except Exception as exc:  # noqa: BLE001
        unknown["torch.cudnn"] = f"{type(exc).__name__}: {exc}"
    doc.update(_cuda_blas(unknown, expected=bool(doc["cuda"])))
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            doc["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
        except Exception as exc:  # noqa: BLE001
            unknown["torch.nccl"] = f"{type(exc).__name__}: {exc}"
    for key, backend in (
        ("mkldnn_available", "mkldnn"),
        ("mkl_available", "mkl"),
        ("openmp_available", "openmp"),
    ):
        try:
            doc[key] = bool(getattr(torch.backends, backend).is_available())
        except Exception as exc:  # noqa: BLE001
            unknown[f"torch.{key}"] = f"{type(exc).__name__}: {exc}"
    triton = _installed_version("triton") or _installed_version("pytorch-triton")
    if triton is not None:
        # The compiler of the compiled variant's GPU kernels (design §2.14): a split of
        # compiled answers between two nodes may be its. Only where it is installed, so
        # the environment of a node without it (a CPU build) keeps its env_key.
        doc["triton"] = triton
    return doc


def _installed_version(distribution: str) -> str | None:
    """The installed version of `distribution`, without importing it."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# The cuBLAS libraries torch's CUDA build links (pip's nvidia-cublas wheels, a CUDA
# toolkit, a container's): which kernels a GEMM gets, hence its rounding, is theirs, and
# the CUDA runtime's version does not say which one was loaded.
_BLAS_LIBRARIES = (("cublas", "libcublas.so"), ("cublaslt", "libcublasLt.so"))


def _mapped_libraries() -> list[str]:
    """The files of the shared libraries mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return list(dict.fromkeys(line.split(None, 5)[5].strip() for line in f
                                      if len(line.split(None, 5)) == 6))
    except OSError:
        return []


def _blas_version(name: str, path: str) -> str:
    """The version a loaded cuBLAS (cublasGetProperty) or cuBLASLt (cublasLtGetVersion)
    library reports of itself."""
    import ctypes

    library = ctypes.CDLL(path)  # already mapped: the same handle, nothing loaded again
    if name == "cublas":
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            status = library.cublasGetProperty(prop, ctypes.byref(value))
            if status != 0:
                raise RuntimeError(f"cublasGetProperty({prop}) returned {status}")
            parts.append(value.value)
        return ".".join(map(str, parts))
    library.cublasLtGetVersion.restype = ctypes.c_size_t
    version = int(library.cublasLtGetVersion())
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def _cuda_blas(unknown: dict[str, str], *, expected: bool) -> dict[str, Any]:
    """cuBLAS and cuBLASLt as this process loaded them, by their own account; null where
    they are not loaded (a CPU build: nothing noted)."""
    found: dict[str, Any] = {name: None for name, _ in _BLAS_LIBRARIES}
    mapped = _mapped_libraries()
    for name, stem in _BLAS_LIBRARIES:
        path = next((p for p in mapped if os.path.basename(p).startswith(stem + ".")
                     or os.path.basename(p) == stem), None)
        if path is None:
            if expected:
                unknown[f"torch.{name}"] = f"{stem} is not loaded in this process"
            continue
        try:
            found[name] = _blas_version(name, path)
        except Exception as exc:  # noqa: BLE001 - recorded, never guessed
            unknown[f"torch.{name}"] = f"{path}: {type(exc).__name__}: {exc}"
    return found


def _threads(unknown: dict[str, str]) -> dict[str, Any]:
    import torch

    doc: dict[str, Any] = {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "parallel_info": None,
    }
    try:
        doc["parallel_info"] = torch.__config__.parallel_info()
    except Exception as exc:  # noqa: BLE001
        unknown["threads.parallel_info"] = f"{type(exc).__name__}: {exc}"
    return doc


def _nvml(unknown: dict[str, str], gpus: list[dict[str, Any]]) -> None:
    """Driver, CUDA driver, ECC and serial from NVML (nvidia-ml-py), when installed."""
    fields = ("driver", "cuda_driver", "ecc", "serial")
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - optional dependency, or no driver
        reason = (
            "nvidia-ml-py (pynvml) not installed"
            if isinstance(exc, ImportError)
            else f"NVML unavailable: {type(exc).__name__}: {exc}"
        )
        for gpu in gpus:
            for field in fields:
                unknown[f"gpus.{gpu['index']}.{field}"] = reason
        return

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    try:
        try:
            driver: str | None = text(pynvml.nvmlSystemGetDriverVersion())
        except Exception as exc:  # noqa: BLE001
            driver = None
            for gpu in gpus:
                unknown[f"gpus.{gpu['index']}.driver"] = f"{type(exc).__name__}: {exc}"
        try:
            getter = getattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", None) or (
                pynvml.nvmlSystemGetCudaDriverVersion
            )
            raw = int(getter())
            cuda_driver: str | None = f"{raw // 1000}.{(raw % 1000) // 10}"
        except Exception as exc:  # noqa: BLE001
            cuda_driver = None
            for gpu in gpus:
                unknown[f"gpus.{gpu['index']}.cuda_driver"] = f"{type(exc).__name__}: {exc}"
        for gpu in gpus:
            gpu["driver"], gpu["cuda_driver"] = driver, cuda_driver
            prefix = f"gpus.{gpu['index']}"
            try:
                if gpu.get("uuid"):
                    handle = _nvml_handle(pynvml, gpu["uuid"], mig=_is_mig(gpu))
                else:
                    # Without a UUID the NVML index only matches when nothing is hidden.
                    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu["index"])
            except Exception as exc:  # noqa: BLE001
                for field in ("ecc", "serial"):
                    unknown[f"{prefix}.{field}"] = f"no NVML handle: {type(exc).__name__}: {exc}"
                continue
            # A MIG instance's ECC mode and serial are its board's.
            board = handle
            try:
                if pynvml.nvmlDeviceIsMigDeviceHandle(handle):
                    board = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            except Exception:  # noqa: BLE001, S110 - bindings without MIG: the handle is it
                pass
            try:
                current, _pending = pynvml.nvmlDeviceGetEccMode(board)
                gpu["ecc"] = bool(current)
            except Exception as exc:  # noqa: BLE001 - consumer GPUs have no ECC
                unknown[f"{prefix}.ecc"] = f"{type(exc).__name__}: {exc}"
            try:
                gpu["serial"] = text(pynvml.nvmlDeviceGetSerial(board))
            except Exception as exc:  # noqa: BLE001
                unknown[f"{prefix}.serial"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - shutting down is best effort
            pass


def _is_mig(gpu: dict[str, Any]) -> bool:
    # CUDA names a MIG instance after its GPU and profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
    return " MIG " in f" {gpu.get('name') or ''} "


def _nvml_handle(pynvml: Any, uuid: str, *, mig: bool) -> Any:
    """NVML's handle of the device torch calls `uuid`: torch's UUID has no prefix, and a
    MIG instance is `MIG-…` to NVML, never `GPU-…` (tried second, in case the name did
    not say MIG)."""
    if uuid.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    first, second = ("MIG", "GPU") if mig else ("GPU", "MIG")
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(f"{first}-{uuid}")
    except Exception:  # noqa: BLE001 - not under this spelling
        return pynvml.nvmlDeviceGetHandleByUUID(f"{second}-{uuid}")


def _gpus(unknown: dict[str, str]) -> list[dict[str, Any]]:
    import torch

    try:
        if not torch.cuda.is_available():
            return []
        count = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001
        unknown["gpus"] = f"{type(exc).__name__}: {exc}"
        return []
    gpus = []
    for index in range(count):
        gpu: dict[str, Any] = {
            "index": index,
            "name": None,
            "compute_capability": None,
            "sm_count": None,
            "memory_bytes": None,
            "uuid": None,
            "driver": None,
            "cuda_driver": None,
            "ecc": None,
            "serial": None,
        }
        try:
            props = torch.cuda.get_device_properties(index)
            gpu["name"] = props.name
            gpu["compute_capability"] = f"{props.major}.{props.minor}"
            gpu["sm_count"] = props.multi_processor_count
            gpu["memory_bytes"] = int(props.total_memory)
            uuid = getattr(props, "uuid", None)
            if uuid is None:
                unknown[f"gpus.{index}.uuid"] = "this torch has no device property uuid"
            else:
                gpu["uuid"] = str(uuid)
        except Exception as exc:  # noqa: BLE001
            unknown[f"gpus.{index}"] = f"{type(exc).__name__}: {exc}"
        gpus.append(gpu)
    _nvml(unknown, gpus)
    return without_identity(gpus)


def capture_environment(*, env_vars: dict[str, str] | None = None) -> dict[str, Any]:
    """The environment document of this process.

    `env_vars` overrides the numeric environment variables read from os.environ: a
    variant's child process reports the node's variables, not the ones it added.
    Call it before changing any knob or thread count.
    """
    import numpy

    unknown: dict[str, str] = {}
    libc_name, libc_version = platform.libc_ver()
    environment: dict[str, Any] = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "platform": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "libc": f"{libc_name} {libc_version}".strip() or None,
            "hostname": platform.node(),
        },
        "cpu": _cpu(unknown),
        "threads": _threads(unknown),
        "torch": _torch(unknown),
        "numpy": {"version": numpy.__version__},
        "knobs": read_knobs(unknown),
        "env_vars": numeric_env_vars() if env_vars is None else dict(sorted(env_vars.items())),
        "gpus": _gpus(unknown),
    }
    if environment["platform"]["libc"] is None:
        unknown["platform.libc"] = "platform.libc_ver() found no libc"
    # The knobs' env var mirrors env_vars, which are the node's (see env_vars above).
    environment["knobs"]["CUBLAS_WORKSPACE_CONFIG"] = environment["env_vars"].get(
        "CUBLAS_WORKSPACE_CONFIG"
    )
    environment["unknown"] = unknown
    environment["env_key"] = compute_env_key(environment)
    return {"env_key": environment.pop("env_key"), **environment}
