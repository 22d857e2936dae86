"""The numeric settings `explain` tries (design §2.11): what each is, where it applies,
and how a child process puts it in force and takes it back.

A `Setting` is a set of environment variables (set or unset before torch starts: the
explain child is started with them) and of knobs (set in the child, one candidate after
another, each restored afterwards). Nothing here imports torch at module level: the
parent only builds and names candidates.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from numparity_agent._compile import INDUCTOR_PREFIX, INDUCTOR_SETTINGS

# Environment variables that change numerics and that a process reads when it starts.
# (variable, devices it applies to, the values worth trying beside unset)
ENV_CHOICES: tuple[tuple[str, frozenset[str], tuple[str, ...]], ...] = (
    # MKL's conditional numerical reproducibility: one code path whatever the CPU.
    ("MKL_CBWR", frozenset({"cpu"}), ("COMPATIBLE", "AVX2", "AVX512", "AVX", "SSE4_2")),
    # ATen's vectorised kernels: the widest the CPU has, unless capped.
    ("ATEN_CPU_CAPABILITY", frozenset({"cpu"}), ("default", "avx2", "avx512")),
    ("OMP_NUM_THREADS", frozenset({"cpu"}), ()),
    ("MKL_NUM_THREADS", frozenset({"cpu"}), ()),
    ("CUBLAS_WORKSPACE_CONFIG", frozenset({"cuda"}), (":4096:8", ":16:8")),
    ("NVIDIA_TF32_OVERRIDE", frozenset({"cuda"}), ("0",)),
)
ENV_NAMES = tuple(name for name, _devices, _values in ENV_CHOICES)

# Knobs set inside the child: (name, devices, values worth trying). "threads" is
# torch.set_num_threads; "sdpa" the one backend scaled_dot_product_attention may use;
# the others are the knob of that name in the environment's `knobs` (design §2.5).
KNOB_CHOICES: tuple[tuple[str, frozenset[str], tuple[Any, ...]], ...] = (
    ("threads", frozenset({"cpu"}), ()),
    ("mkldnn.enabled", frozenset({"cpu"}), (False, True)),
    ("float32_matmul_precision", frozenset({"cpu", "cuda"}), ("highest", "high", "medium")),
    ("sdpa", frozenset({"cpu", "cuda"}), ("math", "flash", "efficient", "cudnn")),
    ("deterministic_algorithms", frozenset({"cpu", "cuda"}), (True, False)),
    ("cuda.matmul.allow_tf32", frozenset({"cuda"}), (False, True)),
    ("cudnn.allow_tf32", frozenset({"cuda"}), (False, True)),
    ("cuda.matmul.fp32_precision", frozenset({"cuda"}), ("ieee", "tf32")),
    ("cudnn.conv.fp32_precision", frozenset({"cuda"}), ("ieee", "tf32")),
    ("cudnn.deterministic", frozenset({"cuda"}), (True, False)),
    ("cudnn.benchmark", frozenset({"cuda"}), (False, True)),
    # Inductor's settings that change a compiled result's numerics (torch._inductor.
    # config, `_compile.INDUCTOR_SETTINGS`): tried for the compiled variant only, each
    # compile in the child made afresh under it (design §2.11, §2.14).
    *((f"inductor.{name}", frozenset({"cpu", "cuda"}), values)
      for name, values in INDUCTOR_SETTINGS),
)
KNOB_NAMES = tuple(name for name, _devices, _values in KNOB_CHOICES)
# The SDPA backends that exist only on CUDA.
_CUDA_ONLY_SDPA = frozenset({"efficient", "cudnn"})


@dataclass(frozen=True)
class Setting:
    """Environment variables (value None: unset) and knobs, each a sorted tuple."""

    env: tuple[tuple[str, str | None], ...] = ()
    knobs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, env: Mapping[str, str | None] | None = None,
           knobs: Mapping[str, Any] | None = None) -> Setting:
        return cls(tuple(sorted((env or {}).items())), tuple(sorted((knobs or {}).items())))

    @property
    def compiler_only(self) -> bool:
        """Whether it sets an Inductor knob: it changes nothing an eager variant runs."""
        return any(name.startswith(INDUCTOR_PREFIX) for name, _value in self.knobs)

    @property
    def size(self) -> int:
        return len(self.env) + len(self.knobs)

    def label(self) -> str:
        """`MKL_CBWR=COMPATIBLE`, `OMP_NUM_THREADS unset`, `threads=2, sdpa=math`."""
        if not self.size:
            return "as configured"
        parts = [f"{name} unset" if value is None else f"{name}={value}"
                 for name, value in self.env]
        parts += [f"{name}={_knob_text(value)}" for name, value in self.knobs]
        return ", ".join(parts)

    def combined(self, other: Setting) -> Setting | None:
        """Both at once; None when they set the same variable or knob."""
        env, knobs = dict(self.env), dict(self.knobs)
        if set(env) & {name for name, _ in other.env} or \
                set(knobs) & {name for name, _ in other.knobs}:
            return None
        env.update(other.env)
        knobs.update(other.knobs)
        return Setting.of(env, knobs)

    def to_json(self) -> dict[str, Any]:
        return {"env": dict(self.env), "knobs": dict(self.knobs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Setting:
        return cls.of(data.get("env") or {}, data.get("knobs") or {})

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with this setting's variables set or removed."""
        environ = dict(base)
        for name, value in self.env:
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        return environ


def _knob_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def applies(name: str, value: Any, device_type: str) -> bool:
    """Whether knob or variable `name` (= `value`) can change anything on `device_type`."""
    for choices in (ENV_CHOICES, KNOB_CHOICES):
        for known, devices, _values in choices:
            if known == name:
                if name == "sdpa" and value in _CUDA_ONLY_SDPA:
                    return device_type == "cuda"
                return device_type in devices
    return False


# ---- in the child: put knobs in force and take them back --------------------------------


class NotApplicable(Exception):
    """This torch has no such knob (or cannot set it to that value)."""


@contextlib.contextmanager
def knobs_in_force(knobs: Mapping[str, Any]) -> Iterator[None]:
    """Set each knob for the block and restore every one afterwards; NotApplicable when
    this torch lacks one."""
    with contextlib.ExitStack() as stack:
        for name, value in knobs.items():
            stack.enter_context(_knob(name, value))
        yield


def _torch_level(name: str) -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    """(read, set) of a knob torch keeps at its top level, else None."""
    import torch

    if name == "threads":
        return torch.get_num_threads, lambda value: torch.set_num_threads(int(value))
    if name == "float32_matmul_precision":
        return (torch.get_float32_matmul_precision,
                lambda value: torch.set_float32_matmul_precision(str(value)))
    if name == "deterministic_algorithms":
        return (torch.are_deterministic_algorithms_enabled,
                lambda value: _set_deterministic(torch, bool(value)))
    return None


@contextlib.contextmanager
def _knob(name: str, value: Any) -> Iterator[None]:
    if name == "sdpa":
        with _sdpa_backend(str(value)):
            yield
        return
    level = _torch_level(name)
    if level is not None:
        read, write = level
    elif name.startswith(INDUCTOR_PREFIX):
        holder, attribute = _inductor_attribute(name)

        def read() -> Any:
            return getattr(holder, attribute)

        def write(new: Any) -> None:
            setattr(holder, attribute, new)
    else:
        holder, attribute = _backend_attribute(name)

        def read() -> Any:
            return getattr(holder, attribute)

        def write(new: Any) -> None:
            setattr(holder, attribute, new)
    before = read()
    write(value)
    try:
        yield
    finally:
        write(before)


def _set_deterministic(torch: Any, enabled: bool) -> None:
    """The deterministic-algorithms flag alone: torch's warn-only flag stays as the
    process has it, so the knob's block gives both back as they were."""
    warn_only = bool(getattr(torch, "is_deterministic_algorithms_warn_only_enabled",
                             lambda: False)())
    # As the strict variant does: the public function imports inductor (2.5 s).
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    else:
        set_flag(enabled, warn_only=warn_only)


def _inductor_attribute(name: str) -> tuple[Any, str]:
    """torch._inductor.config and the setting `inductor.<setting>` names."""
    attribute = name.removeprefix(INDUCTOR_PREFIX)
    try:
        from torch._inductor import config
    except ImportError:
        raise NotApplicable("this torch has no Inductor") from None
    if not hasattr(config, attribute):
        raise NotApplicable(f"this torch's Inductor has no setting {attribute}")
    return config, attribute


def _backend_attribute(name: str) -> tuple[Any, str]:
    """The object below torch.backends and the attribute a dotted knob name sets."""
    import torch

    path, _, attribute = name.rpartition(".")
    holder: Any = torch.backends
    for part in path.split("."):
        holder = getattr(holder, part, None)
        if holder is None:
            raise NotApplicable(f"this torch has no torch.backends.{path}")
    if not hasattr(holder, attribute):
        raise NotApplicable(f"this torch has no torch.backends.{name}")
    return holder, attribute


@contextlib.contextmanager
def _sdpa_backend(backend: str) -> Iterator[None]:
    """scaled_dot_product_attention restricted to one backend (torch >= 2.3's
    sdpa_kernel; before it torch.backends.cuda.sdp_kernel)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        raise NotApplicable("this torch has no torch.nn.attention.sdpa_kernel") from None
    names = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "cudnn": "CUDNN_ATTENTION"}
    member = getattr(SDPBackend, names.get(backend, ""), None)
    if member is None:
        raise NotApplicable(f"this torch has no SDPA backend {backend}")
    with sdpa_kernel([member]):
        yield


def environment_numbers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ENV_NAMES that are set (the child's view)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in ENV_NAMES if name in environ}
