"""The workload registry: built-in names resolve lazily, so listing or validating
names never imports torch (the CLI's parent process stays light)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from numparity_agent._workloads._base import Workload

# The default suite, and the suites there are (design §2.2): a suite is versioned apart,
# so the same workload name in two suites names two definitions.
SUITE = "standard"
LARGE = "large"

# name -> (module, class); each is a Workload subclass with `name` and `version`.
BUILTIN: dict[str, tuple[str, str]] = {
    "mlp": ("numparity_agent._workloads.mlp", "MLP"),
    "cnn": ("numparity_agent._workloads.cnn", "CNN"),
    "transformer": ("numparity_agent._workloads.transformer", "Transformer"),
    "lstm": ("numparity_agent._workloads.lstm", "LSTM"),
    "train": ("numparity_agent._workloads.train", "Train"),
    "probes": ("numparity_agent._workloads.probes", "Probes"),
    "decoder": ("numparity_agent._workloads.decoder", "Decoder"),
    "invariance": ("numparity_agent._workloads.invariance", "Invariance"),
    "collectives": ("numparity_agent._workloads.collectives", "Collectives"),
    "data": ("numparity_agent._workloads.data", "Data"),
}


# `large`: production shapes for GPU nodes (`_workloads/large.py`); opt-in.
LARGE_BUILTIN: dict[str, tuple[str, str]] = {
    "gemm": ("numparity_agent._workloads.large", "GEMM"),
    "resnet_block": ("numparity_agent._workloads.large", "Bottleneck"),
    "attention": ("numparity_agent._workloads.large", "Attention"),
    "decoder": ("numparity_agent._workloads.large", "LargeDecoder"),
    "train": ("numparity_agent._workloads.large", "LargeTrain"),
}
SUITES: dict[str, dict[str, tuple[str, str]]] = {SUITE: BUILTIN, LARGE: LARGE_BUILTIN}
# Variants a suite leaves out unless asked for by name: the float64 reference of the
# large suite computes on the node's CPU (design §2.3), minutes for its GEMMs alone.
NOT_BY_DEFAULT: dict[str, frozenset[str]] = {LARGE: frozenset({"fp64-reference"})}


# Workloads that measure the node rather than one device (collectives span every GPU of
# it; the data pipeline runs on its CPUs): run once per device type of a run, on its
# first device of that type, not on every GPU (design §2.6).
NODE_WIDE = frozenset({"collectives", "data"})


def suite_names() -> list[str]:
    return list(SUITES)


def builtin_names(suite: str = SUITE) -> list[str]:
    return list(SUITES[suite])


def is_factory_spec(spec: str) -> bool:
    """A user workload `module:factory` (design §2.2)."""
    module, sep, attr = spec.partition(":")
    return bool(sep and module and attr)


def is_known(spec: str, suite: str = SUITE) -> bool:
    return spec in SUITES[suite] or is_factory_spec(spec)


def load(spec: str, suite: str = SUITE) -> Workload:
    """The workload named `spec` (a built-in name of `suite`, or `module:factory`)."""
    builtin = SUITES[suite]
    if spec in builtin:
        module, cls = builtin[spec]
        return getattr(importlib.import_module(module), cls)()
    if is_factory_spec(spec):
        # A model and its inputs, a Workload, or a DataLoader (`_user_data`).
        from numparity_agent._workloads._user_data import from_factory

        return from_factory(spec)
    raise KeyError(f"unknown workload {spec!r} in suite {suite}; valid: {', '.join(builtin)} "
                   "or module:factory")
