"""The workload registry: built-in names resolve lazily, so listing or validating
names never imports torch (the CLI's parent process stays light)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from numparity_agent._workloads._base import Workload

SUITE = "standard"

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
}


# Workloads that measure the node rather than one device (collectives span every GPU of
# it): run once per device type of a run, on its first device of that type, not on
# every GPU (design §2.6).
NODE_WIDE = frozenset({"collectives"})


def builtin_names() -> list[str]:
    return list(BUILTIN)


def is_factory_spec(spec: str) -> bool:
    """A user workload `module:factory` (design §2.2)."""
    module, sep, attr = spec.partition(":")
    return bool(sep and module and attr)


def is_known(spec: str) -> bool:
    return spec in BUILTIN or is_factory_spec(spec)


def load(spec: str) -> Workload:
    """The workload named `spec` (a built-in name or `module:factory`)."""
    if spec in BUILTIN:
        module, cls = BUILTIN[spec]
        return getattr(importlib.import_module(module), cls)()
    if is_factory_spec(spec):
        from numparity_agent._workloads._base import from_factory

        return from_factory(spec)
    raise KeyError(f"unknown workload {spec!r}; valid: {', '.join(BUILTIN)} or module:factory")
