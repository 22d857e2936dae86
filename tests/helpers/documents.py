"""Run documents built with numpy, independently of the agent (tests only).

cnn-like tensors with the design §2.4 parts (hash, stats, CountSketch, sample, values) as
base64 wire arrays, and environment documents keyed as .interfaces.md describes.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

IDENTITY_KEYS = {"env_key", "hostname", "uuid", "serial"}


def b64(array: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<"))
                            .tobytes()).decode("ascii")


def tensor_hash(dtype: str, shape: list[int], raw: bytes) -> str:
    """The agent's tensor hash: sha256 over ``dtype;dims;`` and the little-endian bytes."""
    dims = ",".join(str(n) for n in shape)
    return hashlib.sha256(f"{dtype};{dims};".encode() + raw).hexdigest()


def tensor_entry(name: str, kind: str, order: int, array: np.ndarray) -> dict[str, Any]:
    """A full fingerprint of a float32 tensor (design §2.4), computed in float64."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    raw = array.astype("<f4").tobytes()
    digest = tensor_hash("float32", list(array.shape), raw)
    flat = array.astype(np.float64).ravel()
    finite = flat[np.isfinite(flat)]
    absolute = np.abs(flat)
    stats = {
        "count": int(flat.size), "nan": int(np.isnan(flat).sum()),
        "inf": int(np.isinf(flat).sum()), "zero": int((flat == 0).sum()),
        "subnormal": int(((absolute > 0) & (absolute < np.finfo(np.float32).tiny)).sum()),
        "fp16_overflow": int((absolute > 65504).sum()),
        "fp16_underflow": int(((absolute > 0) & (absolute < 6.1e-5)).sum()),
        "min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()),
        "std": float(finite.std()), "abs_max": float(np.abs(finite).max()),
        "l2": float(np.sqrt((finite**2).sum())),
    }
    index = np.arange(flat.size, dtype=np.uint64)
    buckets = (index * np.uint64(2654435761)) % np.uint64(256)
    signs = np.where((index * np.uint64(40503)) & np.uint64(1), 1.0, -1.0)
    sketch = np.zeros(256)
    np.add.at(sketch, buckets.astype(np.int64), signs * flat)
    positions = np.linspace(0, flat.size - 1, num=min(64, flat.size)).astype(np.int64)
    entry: dict[str, Any] = {
        "name": name, "kind": kind, "order": order, "hash": digest, "dtype": "float32",
        "shape": list(array.shape), "stats": stats,
        "sketch": {"k": 256, "dtype": "float64", "data": b64(sketch, "f8")},
        "sample": {"m": int(positions.size), "dtype": "float32",
                   "data": b64(array.ravel()[positions], "f4")},
    }
    if array.size <= 4096:
        entry["values"] = {"dtype": "float32", "data": b64(array, "f4")}
    return entry


def environment(env_vars: dict[str, str] | None = None, threads: int = 2,
                hostname: str = "host") -> dict[str, Any]:
    document: dict[str, Any] = {
        "python": {"version": "3.11.7", "implementation": "CPython"},
        "platform": {"system": "Linux", "release": "6.1", "machine": "x86_64",
                     "libc": "glibc 2.36", "hostname": hostname},
        "cpu": {"model": "Xeon", "flags": "avx2 avx512f", "logical_cpus": 2,
                "capability": "AVX512", "aten_cpu_capability_env": None},
        "threads": {"num_threads": threads, "num_interop_threads": 2, "parallel_info": "..."},
        "torch": {"version": "2.13.0", "git_version": "abc", "config": "...", "cuda": None,
                  "cudnn": None, "nccl": None},
        "numpy": {"version": "2.1.0"},
        "knobs": {"allow_tf32_matmul": False},
        "env_vars": dict(env_vars or {}),
        "gpus": [],
        "unknown": {},
    }
    keyed = {k: v for k, v in document.items() if k not in IDENTITY_KEYS and k != "unknown"}
    keyed["platform"] = {k: v for k, v in document["platform"].items() if k != "hostname"}
    canonical = json.dumps(keyed, sort_keys=True, separators=(",", ":"))
    document["env_key"] = hashlib.sha256(canonical.encode()).hexdigest()
    return document


def rekey(environment: dict[str, Any]) -> dict[str, Any]:
    """``environment`` with its ``env_key`` computed again, as the agent does (the server
    derives it and refuses another, design §2.5): for a test that edits an environment."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k not in IDENTITY_KEYS and k != "unknown"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    canonical = json.dumps(strip(environment), sort_keys=True, separators=(",", ":"),
                           default=str)
    environment["env_key"] = hashlib.sha256(canonical.encode()).hexdigest()
    return environment


def cnn_tensors(shift: float = 0.0, nan_from: str | None = None) -> list[dict[str, Any]]:
    """conv1 → conv2 → fc1 → output; ``shift`` perturbs conv2 onwards (a divergence);
    ``nan_from`` puts a NaN into the first element of that tensor and every later one."""
    rng = np.random.default_rng(1234)
    conv1 = rng.standard_normal((4, 32, 12, 12)).astype(np.float32)
    conv2 = rng.standard_normal((4, 64, 4, 4)).astype(np.float32)
    fc1 = rng.standard_normal((4, 512)).astype(np.float32)
    output = rng.standard_normal((4, 10)).astype(np.float32)
    if shift:
        conv2 = conv2 + np.float32(shift)
        fc1 = fc1 * np.float32(1 + shift)
        output = output * np.float32(1 + shift)
    arrays = {"conv1": conv1, "conv2": conv2, "fc1": fc1, "output": output}
    if nan_from is not None:
        names = list(arrays)
        for name in names[names.index(nan_from):]:
            arrays[name].flat[0] = np.nan
    return [tensor_entry(name, "output" if name == "output" else "layer", order, array)
            for order, (name, array) in enumerate(arrays.items())]


def run_document(
    node: str = "node-1", *, run_id: str | None = None, shift: float = 0.0,
    env_vars: dict[str, str] | None = None, started_at: str = "2026-11-21T10:00:00Z",
    input_hash: str = "in-" + "0" * 61, variants: tuple[str, ...] = ("default",),
    workloads: tuple[str, ...] = ("cnn",), nan_from: str | None = None, drill: bool = False,
) -> dict[str, Any]:
    """A run of ``workloads`` × ``variants`` (cnn-like tensors each) and a skipped tf32
    result per workload; ``shift`` and ``nan_from`` as in ``cnn_tensors``."""
    return {
        "schema": "numparity.run/v1",
        "run_id": run_id or str(uuid.uuid4()),
        "node": {"name": node, "labels": {"rack": "b2"}},
        "agent_version": "0.1.0",
        "started_at": started_at,
        "finished_at": _seconds_after(started_at, 41),
        "drill": drill,
        "environment": environment(env_vars, hostname=node),
        "results": [
            *({"suite": "standard", "workload": workload, "workload_version": 1,
               "variant": variant, "device": "cpu", "status": "ok",
               "input_hash": input_hash, "param_hash": "p" * 64, "repeats": 2,
               "repeats_agree": True, "wall_s": 0.84, "knobs": {"threads": 2},
               "tensors": cnn_tensors(shift if variant != "fp64-reference" else 0.0,
                                      nan_from if variant != "fp64-reference" else None)}
              for workload in workloads for variant in variants),
            *({"workload": workload, "variant": "tf32", "status": "skipped",
               "reason": "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer"}
              for workload in workloads),
        ],
        "future_field": {"ignored": True},
    }


def _seconds_after(started_at: str, seconds: float) -> str:
    start = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    return (start + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def bare(document: dict[str, Any]) -> dict[str, Any]:
    """The same document with every tensor reduced to a reference (name, kind, order, hash)."""
    document = copy.deepcopy(document)
    for result in document["results"]:
        result["tensors"] = [{k: t[k] for k in ("name", "kind", "order", "hash")}
                             for t in result.get("tensors", [])]
    return document


def at(hours_ago: float) -> str:
    """A ``started_at`` ``hours_ago`` before now. The clock is read when a document is
    made, never at import: a full CI run collects tests many minutes before running them."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    return (now - timedelta(hours=hours_ago)).isoformat().replace("+00:00", "Z")


def audit_document(node: str, hours_ago: float, *, shift: float = 0.0, drill: bool = False,
                   repeats_agree: bool = True, **kwargs: Any) -> dict[str, Any]:
    """A default + strict run started ``hours_ago`` (strict takes 1.5x default's time)."""
    doc = run_document(node, started_at=at(hours_ago), shift=shift,
                       variants=("default", "strict"), **kwargs)
    doc["drill"] = drill
    for result in doc["results"]:
        if result["status"] == "ok":
            result["repeats_agree"] = repeats_agree
            result["wall_s"] = 1.0 if result["variant"] == "default" else 1.5
    return doc


A100 = {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}


def gpu_document(node: str, hours_ago: float, uuids: list[str], *,
                 shifted: dict[str, float] | None = None, drill: bool = False,
                 visible: list[str] | None = None) -> dict[str, Any]:
    """A strict cnn run on each of a node's GPUs (``uuids``, at cuda:0, cuda:1 …), the
    run's ``devices`` describing each; ``shifted`` maps a UUID to the shift its answer
    has (a GPU computing wrong); ``visible``: the GPUs the environment lists (default:
    the ones run)."""
    shifted = shifted or {}
    doc = run_document(node, started_at=at(hours_ago), variants=("strict",))
    doc["drill"] = drill
    template = doc["results"][0]
    gpus = [{"index": i, **A100, "sm_count": 108, "memory_bytes": 85_899_345_920,
             "uuid": uuid_, "serial": f"serial-{uuid_}"}
            for i, uuid_ in enumerate(visible if visible is not None else uuids)]
    env = doc["environment"]
    env["gpus"] = gpus
    keyed = _strip_identity({k: v for k, v in env.items() if k not in ("env_key", "unknown")})
    env["env_key"] = hashlib.sha256(
        json.dumps(keyed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    doc["devices"] = [{"device": f"cuda:{i}", "type": "cuda", "index": i, "uuid": uuid_,
                       "serial": f"serial-{uuid_}", "pci_bus_id": f"00000000:{i:02x}:00.0",
                       **A100, "mig": False, "wall_s": 1.0, "status": "ok"}
                      for i, uuid_ in enumerate(uuids)]
    doc["results"] = [{**template, "device": f"cuda:{i}",
                       "tensors": cnn_tensors(shifted.get(uuid_, 0.0))}
                      for i, uuid_ in enumerate(uuids)]
    return doc


def _strip_identity(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_identity(v) for k, v in value.items() if k not in IDENTITY_KEYS}
    if isinstance(value, list):
        return [_strip_identity(v) for v in value]
    return value
