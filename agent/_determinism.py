"""Selective determinism (design §2.13): the ops that make a result nondeterministic, and
what making only them deterministic costs.

A result whose repeats disagree, traced (`run --trace-ops`), gets two more traced passes:
an op whose input references (tensor hashes) and other arguments are the same in both but
whose outputs are not is a nondeterministic op. Later ops read its differing output, so
the difference spreads; only ops with bit-identical inputs are named, so the list is the
causes, not their consequences, and the first of them is where the passes part.

Each named op gets a recipe (`recipe`): torch's deterministic implementation scoped to
the module it ran in (`deterministic_algorithms`), cuDNN's deterministic algorithms
scoped so (`cudnn_deterministic`), or no in-process recipe and why (an op torch has no
deterministic implementation of; libgomp's OMP_DYNAMIC on a CPU). `cost_study` then times
the workload, interleaved, as it is (`default`), with every determinism flag of `strict`
on (`strict`), and with only the recipe's scopes deterministic (`selective`), and checks
that each is repeatable: the answer is "+x % ± e instead of +y % ± e".

The table of torch ops is torch's own documentation of `use_deterministic_algorithms`
(torch 2.x); on a CPU only user ops and OMP_DYNAMIC are verified (no GPU here).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from numparity_agent._sources import UNINITIALIZED, seeded

if TYPE_CHECKING:
    import torch

# Nothing here imports torch at module level: `doctor` reads the recipes without it.

# Ops (overload packet names) that torch makes deterministic on CUDA under
# `use_deterministic_algorithms(True)` (its documentation's first list).
DETERMINISTIC_IMPLEMENTATIONS = frozenset({
    "index_add", "index_add_", "scatter_add", "scatter_add_", "scatter", "scatter_",
    "scatter_reduce", "scatter_reduce_", "index_put", "index_put_", "_index_put_impl_",
    "put_", "index_copy", "index_copy_", "index_select_backward", "gather_backward",
    "repeat_interleave", "embedding_dense_backward", "_embedding_bag_backward",
    "_embedding_bag_dense_backward", "_embedding_bag_per_sample_weights_backward",
    "cumsum", "bmm", "_sparse_addmm",
})
# cuDNN ops whose algorithm cuDNN chooses: deterministic under cudnn.deterministic.
CUDNN_OPS = frozenset({
    "convolution_backward", "cudnn_convolution", "cudnn_convolution_transpose",
    "_cudnn_rnn", "_cudnn_rnn_backward", "cudnn_batch_norm", "cudnn_batch_norm_backward",
    "_cudnn_ctc_loss",
})
# Ops torch has no deterministic CUDA implementation of (its documentation's second list:
# under the flag they raise). The alternative is another algorithm or device.
NO_DETERMINISTIC_IMPLEMENTATION = frozenset({
    "avg_pool3d_backward", "adaptive_avg_pool2d_backward", "adaptive_avg_pool3d_backward",
    "adaptive_max_pool2d_backward", "fractional_max_pool2d_backward",
    "fractional_max_pool3d_backward", "max_pool3d_with_indices_backward",
    "max_unpool1d", "max_unpool2d", "max_unpool3d",
    "upsample_linear1d_backward", "upsample_bilinear2d_backward",
    "upsample_bicubic2d_backward", "upsample_trilinear3d_backward",
    "reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward",
    "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward",
    "nll_loss2d_forward", "_ctc_loss_backward", "histc", "bincount", "kthvalue", "median",
    "grid_sampler_2d_backward", "grid_sampler_3d_backward",
})
MODES = ("default", "strict", "selective")
HINT = ("the repeats disagree: run it again with --trace-ops (and --repeats 2 or more) to "
        "name the ops whose outputs differ on the same inputs")
OMP_DYNAMIC_CAUSE = (
    "OMP_DYNAMIC=true: libgomp sizes each parallel region's thread team by the load "
    "average (one thread fewer per unit of the 15-minute load), so a reduction is split "
    "into a different number of parts when the node is loaded and rounds differently; "
    "unset it or set OMP_DYNAMIC=false")


def omp_dynamic(environ: dict[str, str]) -> bool:
    """Whether libgomp may size thread teams by the load (`OMP_DYNAMIC` true)."""
    return environ.get("OMP_DYNAMIC", "").strip().lower() in ("true", "1", "yes", "on")


def packet(op: str) -> str:
    """`aten.index_add_.default` -> `index_add_`; a user op keeps its namespace."""
    parts = op.split(".")
    if len(parts) >= 3 and parts[0] == "aten":
        return parts[1]
    return ".".join(parts[:-1]) if len(parts) >= 2 else op


def nondeterministic_ops(first: dict[str, Any], second: dict[str, Any]
                         ) -> tuple[list[dict[str, Any]], int | None]:
    """(the ops of two traced passes whose inputs and arguments are the same bits and whose
    outputs are not, each once per (op, module, phase) with `count` and its first `index`;
    the index where the two passes start running other ops, or None).

    The passes are walked in step: a nondeterministic op changes data, not which ops
    run, unless the workload branches on its values (then the walk stops there)."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    parts_at = None
    tensors = {**second.get("tensors", {}), **first.get("tensors", {})}
    ops_a, ops_b = first.get("ops", []), second.get("ops", [])
    for index, (a, b) in enumerate(zip(ops_a, ops_b, strict=False)):
        if (a["op"], a["module"], a["phase"]) != (b["op"], b["module"], b["phase"]):
            parts_at = index
            break
        if a["in"] != b["in"] or a.get("args") != b.get("args") or a["out"] == b["out"]:
            continue
        # A random op draws from a generator whose state came from outside (a source,
        # `_sources`); an uninitialized buffer's bits mean nothing.
        if packet(a["op"]) in UNINITIALIZED or seeded(a["op"]):
            continue
        key = (a["op"], a["module"], a["phase"])
        if key in found:
            found[key]["count"] += 1
            continue
        described = [tensors.get(ref) for ref in a["in"]]
        entry: dict[str, Any] = {
            "op": a["op"], "module": a["module"], "phase": a["phase"], "index": index,
            "count": 1,
            "shapes": [d[1] if d else None for d in described],
            "dtypes": [d[0] if d else None for d in described],
        }
        if a.get("kernel"):
            entry["kernel"] = a["kernel"]
        found[key] = entry
    if parts_at is None and len(ops_a) != len(ops_b):
        parts_at = min(len(ops_a), len(ops_b))
    return sorted(found.values(), key=lambda e: e["index"]), parts_at


def recipe(op: dict[str, Any], *, device_type: str, environ: dict[str, str]
           ) -> dict[str, Any]:
    """How to make this one op deterministic: {"recipe": kind, "flags": [...]} or
    {"recipe": None, "no_recipe": why}."""
    name = packet(op["op"])
    kernel = str(op.get("kernel") or "")
    if device_type == "cpu" and omp_dynamic(environ) and op["op"].startswith("aten."):
        return {"recipe": None, "no_recipe": OMP_DYNAMIC_CAUSE}
    if name in NO_DETERMINISTIC_IMPLEMENTATION:
        return {"recipe": None, "no_recipe": (
            f"torch has no deterministic {device_type} implementation of {name}: compute "
            "it on the CPU (`.cpu()` around the module) or replace the module")}
    if name in CUDNN_OPS or "cudnn" in kernel.lower():
        return {"recipe": "cudnn_deterministic",
                "flags": ["torch.backends.cudnn.deterministic = True",
                          "torch.backends.cudnn.benchmark = False"]}
    if name in DETERMINISTIC_IMPLEMENTATIONS:
        return {"recipe": "deterministic_algorithms",
                "flags": ["torch.use_deterministic_algorithms(True)"]}
    # An op torch does not list (a lab's own op): the flag is tried, and the study says
    # whether the op honours it.
    return {"recipe": "deterministic_algorithms",
            "flags": ["torch.use_deterministic_algorithms(True)"], "tried": True}


def scopes(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scopes the selective run makes deterministic: per module path (`""`: the whole
    model), the phases the ops ran in and the recipe kinds; an optimizer op is scoped to
    the optimizer step."""
    found: dict[str, dict[str, Any]] = {}
    for op in ops:
        if op.get("recipe") is None:
            continue
        module = "" if op["phase"] == "optimizer" else op["module"]
        scope = found.setdefault(module, {"module": module, "phases": [], "recipes": []})
        if op["phase"] not in scope["phases"]:
            scope["phases"].append(op["phase"])
        if op["recipe"] not in scope["recipes"]:
            scope["recipes"].append(op["recipe"])
    return list(found.values())


class Flags:
    """Turns determinism flags on and restores them (nested scopes count)."""

    def __init__(self, recipes: list[str]) -> None:
        self.recipes = recipes
        self._saved: list[tuple[tuple[bool, bool], bool, bool]] = []

    def on(self) -> None:
        import torch

        warn_only = getattr(torch, "is_deterministic_algorithms_warn_only_enabled", bool)()
        self._saved.append(((torch.are_deterministic_algorithms_enabled(), warn_only),
                            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark))
        if "deterministic_algorithms" in self.recipes:
            _set_deterministic(True, warn_only=True)
        if "cudnn_deterministic" in self.recipes:
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False

    def off(self) -> None:
        import torch

        if not self._saved:
            return
        (algorithms, warn_only), deterministic, benchmark = self._saved.pop()
        _set_deterministic(algorithms, warn_only=warn_only)  # as it was, warn-only too
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = benchmark

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        self.on()
        try:
            yield
        finally:
            self.off()


def _set_deterministic(enabled: bool, *, warn_only: bool) -> None:
    import torch

    # A scope turns it on warn_only: an op without a deterministic implementation warns
    # instead of raising, so a study never fails a result; the repeatability check tells
    # what it did. Leaving the scope puts back both flags as they were.
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is not None:
        set_flag(enabled, warn_only=warn_only)
    else:  # pragma: no cover - torch < 1.11
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


@contextlib.contextmanager
def selective(model: torch.nn.Module, found: list[dict[str, Any]]
              ) -> Iterator[dict[str, Callable[[], Any]]]:
    """Only the scopes of `found` (`scopes`) deterministic: forward pre/post hooks and full
    backward pre/post hooks on each module (the same hooks `doctor` prints as the
    recipe). Yields the phase scopes a workload's `Recorder` enters (the optimizer's)."""
    handles = []
    phases: dict[str, Callable[[], Any]] = {}
    for scope in found:
        flags = Flags(scope["recipes"])
        if scope["module"] == "" and scope["phases"] == ["optimizer"]:
            phases["optimizer"] = flags.scope
            continue
        module = model.get_submodule(scope["module"]) if scope["module"] else model
        if "optimizer" in scope["phases"]:
            phases["optimizer"] = flags.scope
        handles.extend(_hooks(module, flags, forward="forward" in scope["phases"],
                              backward="backward" in scope["phases"]))
    try:
        yield phases
    finally:
        for handle in handles:
            handle.remove()


def _hooks(module: torch.nn.Module, flags: Flags, *, forward: bool, backward: bool
           ) -> list[Any]:
    """The hooks that turn `flags` on around the module's forward and/or backward."""
    def on(*_args: Any) -> None:
        flags.on()

    def off(*_args: Any) -> None:
        flags.off()

    handles = []
    if forward:
        handles += [module.register_forward_pre_hook(on), module.register_forward_hook(off)]
    if backward:
        handles += [module.register_full_backward_pre_hook(on),
                    module.register_full_backward_hook(off)]
    return handles


@contextlib.contextmanager
def all_deterministic() -> Iterator[None]:
    """Every determinism flag of `strict` (deterministic algorithms, cuDNN deterministic
    and benchmark off), in this process: what `strict` costs for determinism alone, with
    the variant's other settings (TF32, threads) left as they are."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Flags(["deterministic_algorithms", "cudnn_deterministic"]).scope():
            yield


def comment_text(text: Any) -> str:
    """``text`` safe inside a `#` comment of printed code: no character that ends the
    line (or any other unprintable one) survives, each is written as its escape. The
    names come from a run document, which may be crafted."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def recipe_code(ops: list[dict[str, Any]], *, workload: str = "") -> str:
    """The selective recipe as Python a user pastes after building `model`. Names from
    the document (workload, module, op) appear only as string literals (``repr``) or in
    comments (``comment_text``): pasted, the code runs nothing a document names."""
    found = scopes(ops)
    lines = [f"# numparity: make only the nondeterministic ops of "
             f"{comment_text(workload or 'the model')} deterministic", "import torch", ""]
    none = [op for op in ops if op.get("recipe") is None]
    for op in none:
        lines.append(comment_text(f"# {op['op']} in {op['module'] or 'the model'}: "
                                  f"{op['no_recipe']}"))
    if not found:
        lines.append("# no in-process recipe for these ops")
        return "\n".join(lines) + "\n"
    lines += [
        "def deterministic_only(module, cudnn=False, forward=True, backward=True):",
        "    saved = []",
        "    def on(*_):",
        "        cudnn_flags = torch.backends.cudnn",
        "        saved.append((torch.are_deterministic_algorithms_enabled(),",
        "                      cudnn_flags.deterministic, cudnn_flags.benchmark))",
        "        torch.use_deterministic_algorithms(True)",
        "        if cudnn:",
        "            cudnn_flags.deterministic, cudnn_flags.benchmark = True, False",
        "    def off(*_):",
        "        if saved:",
        "            algorithms, deterministic, benchmark = saved.pop()",
        "            torch.use_deterministic_algorithms(algorithms)",
        "            torch.backends.cudnn.deterministic = deterministic",
        "            torch.backends.cudnn.benchmark = benchmark",
        "    if forward:",
        "        module.register_forward_pre_hook(on)",
        "        module.register_forward_hook(off)",
        "    if backward:",
        "        module.register_full_backward_pre_hook(on)",
        "        module.register_full_backward_hook(off)",
        "",
    ]
    for scope in found:
        cudnn = "cudnn_deterministic" in scope["recipes"]
        names = ", ".join(sorted({op["op"] for op in ops
                                  if op.get("recipe") and (op["module"] == scope["module"])}))
        if scope["phases"] == ["optimizer"]:
            lines.append(comment_text(f"# {names or 'the optimizer step'}: around "
                                      "optimizer.step()"))
            lines.append("# with torch.use_deterministic_algorithms(True): optimizer.step(); "
                         "then back to False")
            continue
        target = (f"model.get_submodule({str(scope['module'])!r})" if scope["module"]
                  else "model")
        forward, backward = "forward" in scope["phases"], "backward" in scope["phases"]
        lines.append(comment_text(f"# {names}"))
        lines.append(f"deterministic_only({target}, cudnn={bool(cudnn)}, "
                     f"forward={bool(forward)}, backward={bool(backward)})")
    return "\n".join(lines) + "\n"
