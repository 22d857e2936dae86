"""Op traces (design §2.7, ``numparity.trace/v1``) built by hand, independently of the
server's code: the hash is computed here as the contract states it.

``cnn_trace`` is the trace of ``documents.cnn_tensors``: its ops' outputs are the
recorded tensors' hashes (their first 16 hex digits), so the server can find the
values of an op's output; the other tensors (inputs, weights, activations that are not
recorded) get references of their own.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from helpers.documents import cnn_tensors

FORMAT = "numparity.trace/v1"


def trace_hash(body: dict[str, Any]) -> str:
    """The contract's trace hash: sha256 of the canonical JSON without ``hash``."""
    content = {k: v for k, v in body.items() if k != "hash"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def ref(label: str) -> str:
    """A tensor reference of a tensor no result records (an input, a weight, an
    intermediate activation), named by a label."""
    return hashlib.sha256(label.encode()).hexdigest()[:16]


def op(name: str, module: str, inputs: Sequence[str], outputs: Sequence[str], *,
       phase: str = "forward", args: str | None = None, kernel: str | None = None
       ) -> dict[str, Any]:
    entry: dict[str, Any] = {"op": name, "module": module, "phase": phase,
                             "in": list(inputs), "out": list(outputs)}
    if args is not None:
        entry["args"] = args
    if kernel is not None:
        entry["kernel"] = kernel
    return entry


def trace(ops: Iterable[dict[str, Any]], tensors: dict[str, tuple[str, list[int]]]
          ) -> dict[str, Any]:
    """A trace body with its hash; ``tensors`` maps each reference to (dtype, shape)."""
    body: dict[str, Any] = {"format": FORMAT, "hash_chars": 16,
                            "tensors": {r: [dtype, list(shape)] for r, (dtype, shape)
                                        in tensors.items()},
                            "ops": list(ops)}
    body["hash"] = trace_hash(body)
    return body


def rehash(body: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["hash"] = trace_hash(body)
    return body


CNN_SHAPES = {"input": [4, 1, 28, 28], "conv1": [4, 32, 12, 12], "relu1": [4, 32, 12, 12],
              "conv2": [4, 64, 4, 4], "flat": [4, 1024], "fc1": [4, 512], "output": [4, 10]}


def cnn_trace(shift: float = 0.0, *, conv2_kernel: str | None = None,
              conv2_op: str = "aten.convolution.default",
              extra_forward_ops: int = 0) -> dict[str, Any]:
    """The forward trace of ``cnn_tensors(shift)``: conv1 → relu → conv2 → view → fc1 →
    output (addmm). With a shift, conv2 is the first op whose output differs while its
    inputs are the same: the origin op. ``conv2_op`` names conv2's op another way (a
    backend that runs another algorithm: the sequences part there); ``extra_forward_ops``
    adds that many ops after conv2 (another algorithm's extra steps)."""
    recorded = {t["name"]: t["hash"][:16] for t in cnn_tensors(shift)}
    refs = {"input": ref("input"), "w1": ref("w1"), "b1": ref("b1"), "w2": ref("w2"),
            "b2": ref("b2"), "w3": ref("w3"), "b3": ref("b3"), "w4": ref("w4"),
            "b4": ref("b4"), "relu1": ref("relu1"),
            # The flattened conv2 output is another tensor of conv2's bits: it differs
            # with them.
            "flat": ref(f"flat-{shift}"),
            **recorded}
    ops = [
        op("aten.convolution.default", "conv1", [refs["input"], refs["w1"], refs["b1"]],
           [refs["conv1"]], args="00000000000000a1"),
        op("aten.relu.default", "relu1", [refs["conv1"]], [refs["relu1"]]),
        op(conv2_op, "conv2", [refs["relu1"], refs["w2"], refs["b2"]], [refs["conv2"]],
           args="00000000000000a2", kernel=conv2_kernel),
        *(op("aten.add.Tensor", "conv2", [refs["conv2"], refs["b2"]], [refs["conv2"]])
          for _ in range(extra_forward_ops)),
        op("aten.view.default", "", [refs["conv2"]], [refs["flat"]], args="00000000000000b1"),
        op("aten.addmm.default", "fc1", [refs["b3"], refs["flat"], refs["w3"]],
           [refs["fc1"]]),
        op("aten.addmm.default", "fc2", [refs["b4"], refs["fc1"], refs["w4"]],
           [refs["output"]]),
    ]
    shapes = {"input": CNN_SHAPES["input"], "w1": [32, 1, 5, 5], "b1": [32],
              "w2": [64, 32, 5, 5], "b2": [64], "w3": [512, 1024], "b3": [512],
              "w4": [10, 512], "b4": [10], "relu1": CNN_SHAPES["relu1"],
              "flat": CNN_SHAPES["flat"], "conv1": CNN_SHAPES["conv1"],
              "conv2": CNN_SHAPES["conv2"], "fc1": CNN_SHAPES["fc1"],
              "output": CNN_SHAPES["output"]}
    return trace(ops, {refs[name]: ("float32", shape) for name, shape in shapes.items()})


def with_traces(document: dict[str, Any], bodies: dict[tuple[str, str], dict[str, Any]], *,
                send_bodies: bool = True) -> dict[str, Any]:
    """``document`` with ``bodies[(workload, variant)]`` as that result's trace; the
    bodies travel in ``traces`` (once per hash) unless ``send_bodies`` is false."""
    document = copy.deepcopy(document)
    sent: dict[str, dict[str, Any]] = {}
    for result in document["results"]:
        body = bodies.get((result["workload"], result["variant"]))
        if body is not None:
            result["trace"] = body["hash"]
            sent.setdefault(body["hash"], body)
    if send_bodies:
        document["traces"] = list(sent.values())
    return document
