"""Origin ops (design §3.3.14) on hand-made traces whose answer is known by construction:
the ops that ran on bit-identical inputs and gave different outputs, where the op
sequences part, and the layer and error of an origin op's output."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from helpers.documents import cnn_tensors
from helpers.traces import cnn_trace

from numparity_server.analysis import Fingerprint, Tolerance, origin_ops, trace_from_body
from numparity_server.analysis.alignment import align
from numparity_server.analysis.origin import MAX_LISTED
from numparity_server.analysis.trace import Trace, TraceOp

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
MATH = "aten._scaled_dot_product_attention_math.default"


def r(label: str) -> str:
    """A 16-hex tensor reference standing for the bits ``label``."""
    return hashlib.sha256(label.encode()).hexdigest()[:16]


@dataclass
class Builder:
    """Ops in execution order over tensors named by labels: two traces that share a label
    share those bits."""

    name: str
    ops: list[TraceOp] = field(default_factory=list)
    shapes: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)

    def add(self, op: str, module: str, inputs: list[str], outputs: list[str], *,
            phase: str = "forward", args: str | None = None, kernel: str | None = None,
            shape: tuple[int, ...] = (8, 8)) -> Builder:
        for label in (*inputs, *outputs):
            self.shapes[r(label)] = ("float32", shape)
        self.ops.append(TraceOp(op, module, phase, tuple(r(x) for x in inputs),
                                tuple(r(x) for x in outputs), args, kernel))
        return self

    def trace(self) -> Trace:
        return Trace(hash=f"trace-{self.name}", tensors=dict(self.shapes), ops=tuple(self.ops))


def mlp(name: str, *, y1: str = "y1", z: str = "z", h: str = "h", mm_args: str = "aa",
        kernel: str | None = None) -> Builder:
    """x → mm(W1) → y1 → relu → y2 → mm(W2) → out, and an independent branch
    x → mm(W3) → z; ``y1``, ``z`` name the bits a side gets."""
    b = Builder(name)
    b.add("aten.mm.default", "fc1", ["x", "W1"], [y1], args=mm_args, kernel=kernel)
    b.add("aten.relu.default", "act", [y1], [f"relu({y1})"])
    b.add("aten.mm.default", "fc2", [f"relu({y1})", "W2"], [f"out({y1})"])
    b.add("aten.mm.default", "side", ["x", "W3"], [z])
    b.add("aten.add.Tensor", "", [f"out({y1})", z], [h])
    return b


def test_same_inputs_different_output_is_the_one_origin():
    """b's fc1 gives other bits from the same x and W1: fc1 is the origin; relu, fc2 and
    the add differ only because their inputs do."""
    found = origin_ops(mlp("a").trace(), mlp("b", y1="y1'", h="h'").trace())
    assert found.parting is None and found.aligned == 5
    assert found.count == 1
    (first,) = found.listed
    assert (first.seq_a, first.seq_b, first.op.op, first.op.module) == (0, 0, "aten.mm.default",
                                                                         "fc1")
    assert found.first is first
    assert first.layer == "fc1" and first.tensor is None  # not recorded: its module path
    assert first.inputs == (("float32", (8, 8)), ("float32", (8, 8)))


def test_independent_sources_are_each_an_origin_in_execution_order():
    found = origin_ops(mlp("a").trace(), mlp("b", y1="y1'", z="z'", h="h'").trace())
    assert found.count == 2
    assert [(o.seq_a, o.op.module) for o in found.listed] == [(0, "fc1"), (3, "side")]


def test_other_arguments_make_inputs_differ_and_equal_outputs_are_no_origin():
    """The same input tensors with other non-tensor arguments are not bit-identical
    inputs; an op with equal outputs is no origin."""
    assert origin_ops(mlp("a").trace(),
                      mlp("b", y1="y1'", h="h'", mm_args="bb").trace()).count == 0
    assert origin_ops(mlp("a").trace(), mlp("b", kernel="mm:other").trace()).count == 0


def test_kernels_of_both_sides_are_reported():
    found = origin_ops(mlp("a", kernel="mm:mkl").trace(),
                       mlp("b", y1="y1'", h="h'", kernel="mm:native").trace())
    assert (found.first.op.kernel, found.first.kernel_b) == ("mm:mkl", "mm:native")
    described = found.to_dict()["ops"][0]
    assert (described["kernel_a"], described["kernel_b"]) == ("mm:mkl", "mm:native")


def attention(name: str, op: str, *, decomposed: int = 0, attended: str = "att",
              out: str = "out", side: str = "side", shape: tuple[int, ...] = (8, 8)
              ) -> Builder:
    """qkv projection → attention (``op``, and ``decomposed`` extra ops a math path runs)
    → output projection; then an independent mm on x (the residual branch)."""
    b = Builder(name)
    b.add("aten.addmm.default", "blocks.0.attn.qkv", ["x", "Wqkv"], ["qkv"])
    b.add("aten.split.Tensor", "blocks.0.attn", ["qkv"], ["q", "k", "v"], args="s1")
    b.add(op, "blocks.0.attn.sdpa", ["q", "k", "v"], [attended if not decomposed else "t0"],
          kernel="sdpa:flash" if "flash" in op else "sdpa:math")
    for i in range(decomposed):
        last = i == decomposed - 1
        b.add("aten.bmm.default" if i % 2 else "aten._softmax.default", "blocks.0.attn.sdpa",
              [f"t{i}"], [attended if last else f"t{i + 1}"])
    b.add("aten.addmm.default", "blocks.0.attn.proj", [attended, "Wp"], [out])
    b.add("aten.mm.default", "blocks.0.residual", ["x", "Wr"], [side], shape=shape)
    return b


def test_sequences_that_part_name_both_ops_and_the_origin_after_the_parting_point():
    """Another SDPA backend: b runs the math path (three more ops) where a runs flash.
    The parting point names both; the projection after it has other inputs (no origin);
    the residual mm after it ran on the same bits and differs: an origin, at b's own
    position (three ops later than a's)."""
    a = attention("a", FLASH).trace()
    b = attention("b", MATH, decomposed=3, attended="att'", out="out'", side="side'").trace()
    found = origin_ops(a, b)
    assert found.parting is not None
    assert (found.parting.seq_a, found.parting.seq_b) == (2, 2)
    assert (found.parting.a.op, found.parting.b.op) == (FLASH, MATH)
    parting = found.to_dict()["parting"]
    assert (parting["a"], parting["b"], parting["kernel_a"], parting["kernel_b"]) == (
        FLASH, MATH, "sdpa:flash", "sdpa:math")
    assert found.count == 1
    (residual,) = found.listed
    assert (residual.seq_a, residual.seq_b, residual.op.module) == (4, 7, "blocks.0.residual")
    assert found.to_dict()["same_sequence"] is False


def test_a_trace_that_stops_early_parts_where_it_ends():
    a = attention("a", FLASH).trace()
    shorter = Trace("trace-b", a.tensors, a.ops[:3])
    found = origin_ops(a, shorter)
    assert (found.parting.seq_a, found.parting.a.op, found.parting.b) == (
        3, "aten.addmm.default", None)
    assert found.aligned == 3 and found.count == 0


def pairs_and_parting(a, b):
    alignment = align(a, b)
    assert alignment.through is None  # these take far less than the budget
    return alignment.pairs, alignment.parting


def test_alignment_pairs_equal_signatures_in_order():
    sig = {name: (name, "", "forward", (), ()) for name in "ABCDXY"}
    a = [sig[c] for c in "ABCD"]
    b = [sig[c] for c in "AXYCD"]
    assert pairs_and_parting(a, b) == ([(0, 0), (2, 3), (3, 4)], 1)
    assert pairs_and_parting(a, a) == ([(0, 0), (1, 1), (2, 2), (3, 3)], None)
    # Shapes are part of the signature: the same op on other shapes is another step.
    other = [sig["A"], ("B", "", "forward", (("float32", (2,)),), ()), sig["C"], sig["D"]]
    assert pairs_and_parting(a, other) == ([(0, 0), (2, 2), (3, 3)], 1)


def test_long_stretches_of_few_signatures_align_by_occurrence():
    """19,200 ops of 48 signatures repeated, between ops that differ at both ends: too many
    equal pairs for SequenceMatcher (ten minutes), so the k-th of each signature pairs
    with the k-th: the repeated ops align one to one, each with its own position."""
    sig = [(f"aten.op{k}.default", "", "backward", (), ()) for k in range(48)]
    body = sig * 400
    a = [("aten.start.default", "", "forward", (), ()), *body,
         ("aten.end.default", "", "forward", (), ())]
    b = [("aten.begin.default", "", "forward", (), ()), *body,
         ("aten.finish.default", "", "forward", (), ())]
    pairs, part = pairs_and_parting(a, b)
    assert part == 0
    assert pairs == [(i, i) for i in range(1, len(body) + 1)]
    # A reordered stretch: pairs of equal signatures, running forward on both sides.
    c = [b[0], *sig[24:] * 200, *sig[:24] * 200, b[-1]]
    pairs, _ = pairs_and_parting(a, c)
    assert pairs and all(a[i] == c[j] for i, j in pairs)
    assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:], strict=False))


def test_backward_and_optimizer_phases():
    """A train step: the forward agrees; in the backward the weight gradient (mm of the
    same bits) differs, an origin of phase backward; the optimizer's update of the
    weight then has another gradient: no origin."""
    def step(name: str, grad: str, param: str) -> Trace:
        b = Builder(name)
        b.add("aten.mm.default", "fc", ["x", "W"], ["y"])
        b.add("aten.sum.default", "", ["y"], ["loss"])
        b.add("aten.ones_like.default", "", ["loss"], ["g_loss"], phase="backward")
        b.add("aten.expand.default", "", ["g_loss"], ["g_y"], phase="backward", args="e1")
        b.add("aten.mm.default", "fc", ["g_y", "x"], [grad], phase="backward")
        b.add("aten.add_.Tensor", "", ["W", grad], [param], phase="optimizer", args="lr")
        return b.trace()

    found = origin_ops(step("a", "gW", "W1"), step("b", "gW'", "W1'"))
    assert found.parting is None and found.count == 1
    (origin,) = found.listed
    assert (origin.seq_a, origin.op.op, origin.op.phase) == (4, "aten.mm.default", "backward")


def fingerprint(digest: str, values: np.ndarray) -> Fingerprint:
    return Fingerprint(hash=digest, dtype="float32", shape=values.shape,
                       values=values.astype(np.float32))


def test_an_origin_whose_output_is_recorded_is_named_and_measured():
    """fc1's output is a recorded tensor on both sides (its reference is the prefix of the
    tensor's hash in each manifest): the origin names that layer and compares the two
    tensors. Run a's values are 0, b's 0.5: divergent by 0.5 everywhere."""
    hash_a = r("y1").ljust(64, "0")
    hash_b = r("y1'").ljust(64, "0")
    manifest_a = [("fc1", "layer", hash_a)]
    manifest_b = [("fc1", "layer", hash_b)]
    fingerprints = {hash_a: fingerprint(hash_a, np.zeros((8, 8))),
                    hash_b: fingerprint(hash_b, np.full((8, 8), 0.5))}
    found = origin_ops(mlp("a").trace(), mlp("b", y1="y1'", h="h'").trace(),
                       manifest_a=manifest_a, manifest_b=manifest_b,
                       fingerprints=fingerprints,
                       tolerance_for=lambda dtype: Tolerance(rtol=0.0, atol=0.0))
    first = found.first
    assert first.tensor == "fc1" and first.layer == "fc1"
    described = first.to_dict()["output"]
    assert described["tensor"] == "fc1"
    assert (described["verdict"], described["basis"]) == ("divergent", "values")
    assert described["metrics"]["max_abs"] == 0.5
    assert described["metrics"]["mismatch_fraction"] == 1.0


def test_an_output_recorded_on_one_side_only_is_named_but_not_measured():
    hash_a = r("y1").ljust(64, "0")
    found = origin_ops(mlp("a").trace(), mlp("b", y1="y1'", h="h'").trace(),
                       manifest_a=[("fc1", "layer", hash_a)], manifest_b=[])
    assert found.first.tensor == "fc1" and found.first.output is None


def test_the_same_trace_has_no_origin_and_many_are_capped_with_their_count():
    a = mlp("a").trace()
    assert origin_ops(a, a).count == 0 and origin_ops(a, a).aligned == 5
    many_a, many_b = Builder("a"), Builder("b")
    for i in range(MAX_LISTED + 5):
        many_a.add("aten.exp.default", f"m{i}", [f"x{i}"], [f"e{i}"])
        many_b.add("aten.exp.default", f"m{i}", [f"x{i}"], [f"e{i}'"])
    found = origin_ops(many_a.trace(), many_b.trace())
    assert found.count == MAX_LISTED + 5 and len(found.listed) == MAX_LISTED
    assert [o.seq_a for o in found.listed] == list(range(MAX_LISTED))
    assert found.to_dict()["count"] == MAX_LISTED + 5


def test_the_cnn_traces_of_the_test_documents_find_conv2():
    """The helpers' traces through the body parser, with the documents' manifests: a
    shift from conv2 on makes conv2 the origin op, its output the recorded conv2."""
    def manifest(shift: float) -> list[tuple[str, str, str]]:
        return [(t["name"], t["kind"], t["hash"]) for t in cnn_tensors(shift)]

    a, b = trace_from_body(cnn_trace()), trace_from_body(cnn_trace(1e-3))
    assert a.hash == cnn_trace()["hash"]
    found = origin_ops(a, b, manifest_a=manifest(0.0), manifest_b=manifest(1e-3))
    assert found.count == 1
    assert (found.first.op.op, found.first.layer) == ("aten.convolution.default", "conv2")
    assert found.first.output is not None and found.first.output.tensor == "conv2"
    assert found.first.outputs == (("float32", (4, 64, 4, 4)),)
