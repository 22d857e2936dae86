"""Variants: the numeric configurations a workload runs under (DESIGN §2.3).

A variant acts at three moments, all in its own child process:
- `child_env`: environment variables that must be set before torch (or CUDA) starts;
- `skip_reason`: why it cannot run on this device (reported as skipped, never dropped);
- `apply`: knobs set once, before the workloads;
and a variant may wrap each run in a context (`run_context`, for autocast) and choose
the dtype workloads are built in (`dtype`, float64 for the reference). New variants
(tf32, fp16-autocast, bf16-autocast, fp64-reference) subclass Variant and register.

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


class Variant:
    name: str = ""
    description: str = ""
    dtype_name: str = "float32"

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


class Default(Variant):
    name = "default"
    description = "the node's framework defaults, untouched"


class Strict(Variant):
    name = "strict"
    description = (
        "seeds, deterministic algorithms, cuDNN benchmark off and deterministic, TF32 off, "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8, explicit thread count"
    )

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
    compiled kernels deterministic, which pulls in dynamo. The suite never compiles, so
    the inductor flag is only set when inductor is already loaded.
    """
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None:
        torch.use_deterministic_algorithms(True)
        return
    set_flag(True, warn_only=False)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        setattr(inductor_config, "deterministic", True)  # noqa: B010 - a module attribute


VARIANTS: dict[str, Variant] = {v.name: v for v in (Default(), Strict())}


def names() -> list[str]:
    return list(VARIANTS)


def get(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise KeyError(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)}") from None
