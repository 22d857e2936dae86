"""Origin ops: the operations where two runs' numbers part (design §3.3.14).

Given the op traces of a reference (a) and a candidate (b), an **origin op** is an
operation both ran on bit-identical inputs (the same input hashes and the same other
arguments) whose outputs differ. Each is an independent source of difference: what it
computed differently cannot come from anything before it. An op whose inputs already
differ only carries a difference on, and is never an origin.

Ops are paired by their signature (op, module, phase, dtypes and shapes in and out;
``trace.Signature``) by ``alignment.align``, in bounded work: the **parting point** is
the first position where the sequences differ (another SDPA backend runs another op
there), and sequences that part for a few ops (one attention call) meet again. When the
alignment's work budget runs out, ``aligned_up_to`` says from which op of run a's trace
on nothing was aligned, and no origin op is looked for there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._json import json_safe
from .alignment import align
from .compare import Comparison
from .fingerprint import Fingerprint
from .layers import Manifest, compare_hashes
from .tolerance import Tolerance
from .trace import Trace, TraceOp

# Origin ops listed per pair (the count covers them all): a difference from one setting
# (a kernel, a thread count) usually starts at a handful of ops; hundreds mean every op
# of a kind differs, and the first ones say so.
MAX_LISTED = 20
TRACE_HINT = "run the agent with --trace-ops"


@dataclass(frozen=True)
class Parting:
    """The first position where the two op sequences differ (an op of one trace that is
    not there, or not the same op, in the other): both sides named; None past a trace's
    end."""

    seq_a: int
    seq_b: int
    a: TraceOp | None
    b: TraceOp | None

    def to_dict(self) -> dict[str, Any]:
        def side(op: TraceOp | None, name: str) -> dict[str, Any]:
            return {name: op.op if op else None,
                    f"module_{name}": op.module if op else None,
                    f"phase_{name}": op.phase if op else None,
                    f"kernel_{name}": op.kernel if op else None}

        return {"seq_a": self.seq_a, "seq_b": self.seq_b, **side(self.a, "a"),
                **side(self.b, "b")}


@dataclass(frozen=True)
class OutputComparison:
    """The origin op's output compared where both sides' outputs are recorded tensors."""

    tensor: str  # the recorded tensor's name (run a's)
    comparison: Comparison

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, **self.comparison.to_dict()}


@dataclass(frozen=True)
class OriginOp:
    seq_a: int
    seq_b: int
    op: TraceOp  # run a's (the pair has one signature: op, module, phase, shapes)
    kernel_b: str | None
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...]
    # The recorded tensor its output is (in either result), else None.
    tensor: str | None
    output: OutputComparison | None

    @property
    def layer(self) -> str:
        """Where in the model: the recorded tensor its output is, else its module path."""
        return self.tensor or self.op.module

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq_a": self.seq_a, "seq_b": self.seq_b, "op": self.op.op,
            "module": self.op.module, "phase": self.op.phase, "layer": self.layer,
            "tensor": self.tensor,
            "inputs": [{"dtype": dtype, "shape": list(shape)} for dtype, shape in self.inputs],
            "outputs": [{"dtype": dtype, "shape": list(shape)}
                        for dtype, shape in self.outputs],
            "kernel_a": self.op.kernel, "kernel_b": self.kernel_b,
            "output": self.output.to_dict() if self.output else None,
        }


@dataclass(frozen=True)
class Origins:
    trace_a: str
    trace_b: str
    ops_a: int
    ops_b: int
    aligned: int  # pairs of ops the alignment made
    parting: Parting | None
    count: int  # origin ops in all
    listed: tuple[OriginOp, ...] = field(default=())  # the first MAX_LISTED of them
    # None: every op aligned; else the first op of a the alignment's budget left out.
    aligned_up_to: int | None = None

    @property
    def first(self) -> OriginOp | None:
        return self.listed[0] if self.listed else None

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            "trace_a": self.trace_a, "trace_b": self.trace_b, "ops_a": self.ops_a,
            "ops_b": self.ops_b, "same_sequence": self.parting is None,
            "aligned": self.aligned, "aligned_up_to": self.aligned_up_to,
            "parting": self.parting.to_dict() if self.parting else None,
            "count": self.count, "ops": [origin.to_dict() for origin in self.listed],
        })


def origin_ops(a: Trace, b: Trace, *, manifest_a: Manifest = (), manifest_b: Manifest = (),
               fingerprints: Mapping[str, Fingerprint] | None = None,
               tolerance_for: Callable[[str], Tolerance] | None = None,
               listed: int = MAX_LISTED) -> Origins:
    """The origin ops of candidate trace ``b`` against reference ``a``, in execution
    order, the first ``listed`` of them described.

    ``manifest_a``/``manifest_b`` are the results' recorded tensors ``(name, kind,
    hash)``: an op output whose reference is the prefix of one of their hashes is that
    tensor (its layer), and where it is one on both sides and ``fingerprints`` has
    both, the two are compared (b against a, under ``tolerance_for``'s tolerance).
    """
    if a.hash and a.hash == b.hash:  # the same trace: the same ops on the same bits
        return Origins(a.hash, b.hash, len(a.ops), len(b.ops), len(a.ops), None, 0)
    alignment = align(a.signatures, b.signatures)
    pairs, part = alignment.pairs, alignment.parting
    parting = None
    if part is not None:
        parting = Parting(part, part, a.ops[part] if part < len(a.ops) else None,
                          b.ops[part] if part < len(b.ops) else None)
    recorded_a = _recorded(manifest_a, a.hash_chars)
    recorded_b = _recorded(manifest_b, b.hash_chars)
    found: list[OriginOp] = []
    count = 0
    for i, j in pairs:
        op_a, op_b = a.ops[i], b.ops[j]
        if not op_a.same_inputs(op_b) or op_a.outputs == op_b.outputs:
            continue
        count += 1
        if len(found) < listed:
            found.append(_describe(i, j, a, op_a, op_b, recorded_a, recorded_b,
                                   {} if fingerprints is None else fingerprints,
                                   tolerance_for))
    return Origins(a.hash, b.hash, len(a.ops), len(b.ops), len(pairs), parting, count,
                   tuple(found), alignment.through)


def _recorded(manifest: Manifest, chars: int) -> dict[str, tuple[str, str]]:
    """Reference → (name, full hash) of a result's recorded tensors; of tensors with the
    same bits (a last layer and ``output``), the first in execution order."""
    recorded: dict[str, tuple[str, str]] = {}
    for name, _kind, digest in manifest:
        recorded.setdefault(digest[:chars], (name, digest))
    return recorded


def _describe(i: int, j: int, a: Trace, op_a: TraceOp, op_b: TraceOp,
              recorded_a: Mapping[str, tuple[str, str]],
              recorded_b: Mapping[str, tuple[str, str]],
              fingerprints: Mapping[str, Fingerprint],
              tolerance_for: Callable[[str], Tolerance] | None) -> OriginOp:
    # Of the outputs that differ, the first recorded on both sides is compared; else the
    # first recorded on either side names the layer.
    differing = [(ref_a, ref_b) for ref_a, ref_b in zip(op_a.outputs, op_b.outputs,
                                                        strict=True) if ref_a != ref_b]
    tensor: str | None = None
    output: OutputComparison | None = None
    for ref_a, ref_b in differing:
        if ref_a in recorded_a and ref_b in recorded_b:
            (name, hash_a), (_name_b, hash_b) = recorded_a[ref_a], recorded_b[ref_b]
            tensor = name
            output = OutputComparison(name, compare_hashes(
                hash_b, hash_a, fingerprints, None, tolerance_for))
            break
    if tensor is None:
        tensor = next((side[ref][0] for ref_a, ref_b in differing
                       for side, ref in ((recorded_a, ref_a), (recorded_b, ref_b))
                       if ref in side), None)
    return OriginOp(seq_a=i, seq_b=j, op=op_a, kernel_b=op_b.kernel,
                    inputs=tuple(a.spec(r) for r in op_a.inputs),
                    outputs=tuple(a.spec(r) for r in op_a.outputs),
                    tensor=tensor, output=output)


def no_trace_note(without: Sequence[str]) -> str:
    """Why there are no origin ops: ``without`` names the sides that have no op trace
    ("run b's result")."""
    verb = "has" if len(without) == 1 else "have"
    return f"{' and '.join(without)} {verb} no op trace: {TRACE_HINT}"
