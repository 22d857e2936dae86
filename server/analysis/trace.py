"""An op trace as the analysis sees it (design §2.7, ``numparity.trace/v1``): every aten
operation of one result in execution order, its tensors named by the first
``hash_chars`` hex digits of their fingerprint hashes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

# (dtype, shape) of a traced tensor.
TensorSpec = tuple[str, tuple[int, ...]]
# What aligns two ops of two traces: the same op, under the same module, in the same
# phase, on tensors of the same dtypes and shapes. The kernel is left out: another
# kernel for the same op is a difference to explain, not another step of the program.
Signature = tuple[str, str, str, tuple[TensorSpec, ...], tuple[TensorSpec, ...]]

UNKNOWN_TENSOR: TensorSpec = ("?", ())


class TraceOp(NamedTuple):
    """One op. A named tuple rather than a frozen dataclass: a 50,000-op trace builds
    50,000 of them on each read, and a tuple is made several times faster."""

    op: str  # the overload: aten.addmm.default
    module: str  # the module path it ran under ("" outside any)
    phase: str  # forward, backward or optimizer
    inputs: tuple[str, ...]  # tensor references, argument order
    outputs: tuple[str, ...]
    args: str | None = None  # hash of the non-tensor arguments
    kernel: str | None = None  # what the backend chose, when recorded

    def same_inputs(self, other: TraceOp) -> bool:
        """Bit-identical inputs: the same tensors (by hash) and the same other arguments."""
        return self.inputs == other.inputs and self.args == other.args


@dataclass(frozen=True)
class Trace:
    hash: str
    tensors: Mapping[str, TensorSpec]
    ops: tuple[TraceOp, ...]
    hash_chars: int = 16

    def spec(self, ref: str) -> TensorSpec:
        return self.tensors.get(ref, UNKNOWN_TENSOR)

    def signature(self, op: TraceOp) -> Signature:
        spec = self.tensors.get
        return (op.op, op.module, op.phase,
                tuple([spec(r, UNKNOWN_TENSOR) for r in op.inputs]),
                tuple([spec(r, UNKNOWN_TENSOR) for r in op.outputs]))

    @cached_property
    def signatures(self) -> list[Signature]:
        """Every op's signature, in order (computed once: /divergence aligns a trace with
        each other group's)."""
        return [self.signature(op) for op in self.ops]


def trace_from_body(body: Mapping[str, Any], digest: str | None = None) -> Trace:
    """A trace from its body as the agent sends it (``in``/``out`` lists, ``tensors``
    mapping each reference to ``[dtype, shape]``). ``digest`` is its hash when the body
    no longer carries it (the server stores bodies without their hash)."""
    # The server stores only bodies it validated (strings, integer dimensions).
    tensors = {ref: (spec[0], tuple(spec[1])) for ref, spec in body.get("tensors", {}).items()}
    ops = tuple(
        TraceOp(entry["op"], entry.get("module", ""), entry["phase"],
                tuple(entry.get("in", ())), tuple(entry.get("out", ())),
                entry.get("args"), entry.get("kernel"))
        for entry in body.get("ops", ()))
    return Trace(hash=digest or str(body.get("hash", "")), tensors=tensors, ops=ops,
                 hash_chars=int(body.get("hash_chars", 16)))
