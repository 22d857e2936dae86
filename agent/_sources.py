"""Where a difference between two traced passes comes from (design §2.13): an op that
gives other bits on the same inputs (`_determinism.nondeterministic_ops`), or a value
that enters the computation from outside the traced ops.

Two located passes (`_trace.OpTracer(locate=True)`) are walked in step. A tensor
reference is *computed* when an earlier op of the pass (or a view of one) made it, and
*tainted* when the op that made it gave other bits in the other pass. An op whose
outputs differ is explained when every input that differs is tainted: the difference
reached it. Otherwise the difference enters there, and `difference_sources` says how:

- `host_data`: an input no traced op made, and not the workload's own input or
  parameter: a tensor made from Python or numpy values (`torch.tensor`, `from_numpy`),
  which differ between the passes (an unseeded `random`, `numpy.random`, `os.urandom`,
  `time`);
- `dataloader`: such an input, made while a DataLoader's code ran (a batch whose order
  or augmentation came from an unseeded sampler or worker);
- `order`: inputs computed in both passes, but other ones: Python code chose which (a
  shuffled list, a set's order);
- `argument`: the same inputs, another non-tensor argument (a Python number drawn
  outside torch);
- `generator`: a random op (torch's `nondeterministic_seeded` tag) with the same inputs
  and arguments: the generator it drew from was in another state;
- `input`: the workload's own input or parameter differs (its build is not seeded).

Each source names the op, its module and phase, the code that called it (`at`), and
the recipe that applies (`RECIPES`). No in-process scope makes such a source
deterministic, so the cost study has nothing to time for it.
"""

from __future__ import annotations

import functools
from typing import Any

# Ops whose output is memory nobody wrote yet: its bits are whatever was there, in every
# run, and mean nothing until an op writes them.
UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                           "new_empty_strided", "empty_permuted"})
SEED_GENERATOR = (
    "seed the generator that made it: random.seed(s) and numpy.random.seed(s) (or a "
    "numpy.random.default_rng(s) passed down) before building; os.urandom, secrets, "
    "uuid4, id() and the time cannot be seeded: draw from a seeded generator instead")
RECIPES: dict[str, tuple[str, str]] = {
    "host_data": ("seed_generator", SEED_GENERATOR),
    "argument": ("seed_generator", SEED_GENERATOR),
    "order": ("stable_order", (
        "make the order a function of the data: sort what a set or dict yields, seed "
        "the shuffle (random.Random(s).shuffle); a set or dict of str or bytes iterates "
        "in another order in every process unless PYTHONHASHSEED is set (export "
        "PYTHONHASHSEED=0), one of objects hashed by id() in every run")),
    "dataloader": ("dataloader", (
        "the DataLoader recipe: torch.manual_seed(s) before iterating, "
        "DataLoader(..., generator=torch.Generator().manual_seed(s), "
        "worker_init_fn=seed_worker) where seed_worker seeds random and numpy.random "
        "from torch.initial_seed() % 2**32; augmentations draw from those generators")),
    "generator": ("seed_torch", (
        "seed torch's generator before the run (torch.manual_seed(s), on every device), "
        "or pass the op a torch.Generator().manual_seed(s)")),
    "input": ("seed_build", (
        "the workload builds other inputs or parameters each time: seed what builds "
        "them (torch.manual_seed(s), random.seed(s), numpy.random.seed(s)) first")),
}
WHAT = {
    "host_data": "a tensor that no traced op made, from Python or numpy values "
                 "(torch.tensor, torch.from_numpy, as_tensor), with other values",
    "dataloader": "a DataLoader's draw or batch with other values (its sampler or "
                  "workers draw from generators that nothing seeded)",
    "order": "other tensors than in the other pass, though both were computed alike: "
             "Python code chose which (a shuffled list, a set's or dict's order)",
    "argument": "another non-tensor argument (a Python value computed outside torch)",
    "generator": "the same inputs and arguments: the random generator it drew from was "
                 "in another state",
    "input": "the workload's own input or parameter, built with other values",
}


@functools.lru_cache(maxsize=4096)
def seeded(op: str) -> bool:
    """Whether the aten op `op` (`aten.bernoulli.p`) draws from a random generator (its
    `nondeterministic_seeded` tag)."""
    parts = op.split(".")
    if len(parts) < 3 or parts[0] != "aten":
        return False
    try:
        import torch

        overload = getattr(getattr(torch.ops.aten, parts[1]), parts[2])
        return torch.Tag.nondeterministic_seeded in overload.tags
    except (AttributeError, RuntimeError):
        return False


def _packet(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "aten" else op


class _Pass:
    """One pass walked: what is computed and what is tainted, views applied in order."""

    def __init__(self, body: dict[str, Any], known: dict[str, str]) -> None:
        self.views = list(body.get("views") or [])
        self.known = known
        self.computed: set[str] = set()
        self.tainted: set[str] = set()
        self.uninitialized: dict[str, str] = {}
        self._next_view = 0

    def views_before(self, index: int) -> None:
        while self._next_view < len(self.views) and \
                self.views[self._next_view]["before"] <= index:
            view = self.views[self._next_view]
            self._next_view += 1
            ins = [self.canonical(r) for r in view["in"]]
            if any(r in self.computed for r in ins):
                self.computed.update(view["out"])
            if any(r in self.tainted for r in ins):
                self.tainted.update(view["out"])
            if any(r in self.uninitialized.values() for r in ins):
                # A view of an unwritten buffer: as meaningless, named by its place.
                for position, ref in enumerate(view["out"]):
                    self.uninitialized.setdefault(
                        ref, f"uninitialized#view{self._next_view}.{position}")

    def canonical(self, ref: str) -> str:
        return self.uninitialized.get(ref, ref)


def difference_sources(first: dict[str, Any], second: dict[str, Any], *,
                       known: tuple[dict[str, str], dict[str, str]] | None = None,
                       environ: dict[str, str] | None = None
                       ) -> tuple[list[dict[str, Any]], bool]:
    """(where a difference enters the two located passes from outside their ops, each
    once per (op, module, phase) with `count` and its first `index`, in order; whether
    the passes computed the same bits, every op's outputs alike).

    `known`: per pass, the references of the workload's built inputs and parameters
    and their names."""
    known_a, known_b = known or ({}, {})
    passes = (_Pass(first, known_a), _Pass(second, known_b))
    tensors = {**second.get("tensors", {}), **first.get("tensors", {})}
    ops_a, ops_b = first.get("ops", []), second.get("ops", [])
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    equal = len(ops_a) == len(ops_b)
    for index, (a, b) in enumerate(zip(ops_a, ops_b, strict=False)):
        if (a["op"], a["module"], a["phase"]) != (b["op"], b["module"], b["phase"]):
            equal = False
            break  # the passes run other ops: the walk in step ends
        for one in passes:
            one.views_before(index)
        pa, pb = passes
        ins_a = [pa.canonical(r) for r in a["in"]]
        ins_b = [pb.canonical(r) for r in b["in"]]
        if _packet(a["op"]) in UNINITIALIZED:
            for one, op in ((pa, a), (pb, b)):
                for position, ref in enumerate(op["out"]):
                    one.uninitialized[ref] = f"uninitialized#{index}.{position}"
                one.computed.update(op["out"])
            continue
        differ = a["out"] != b["out"]
        if differ:
            equal = False
            source = _source(a, b, ins_a, ins_b, pa, pb)
            if source is not None:
                _add(found, source, a, index, tensors, environ or {})
            pa.tainted.update(a["out"])
            pb.tainted.update(b["out"])
        pa.computed.update(a["out"])
        pb.computed.update(b["out"])
    return sorted(found.values(), key=lambda e: e["index"]), equal


def _source(a: dict[str, Any], b: dict[str, Any], ins_a: list[str], ins_b: list[str],
            pa: _Pass, pb: _Pass) -> tuple[str, int | None, str | None] | None:
    """(kind, the position of the input it entered by, the workload's name for that
    input) of an op whose outputs differ, or None: explained by tainted inputs, or an
    op that is nondeterministic itself."""
    if len(ins_a) != len(ins_b):
        return ("order", None, None)
    differing = [k for k, (x, y) in enumerate(zip(ins_a, ins_b, strict=True)) if x != y]
    fresh = [k for k in differing if ins_a[k] not in pa.tainted and ins_b[k] not in pb.tainted]
    if differing and not fresh:
        return None  # the difference reached it through its inputs
    if not differing:
        if a.get("args") != b.get("args"):
            return ("argument", None, None)
        if seeded(a["op"]):
            # A sampler's or a worker's draw: the DataLoader's recipe seeds it.
            return ("dataloader" if a.get("via") == "DataLoader" else "generator", None,
                    None)
        return None  # same inputs, other outputs: a nondeterministic op itself
    k = fresh[0]
    x, y = ins_a[k], ins_b[k]
    if x in pa.known or y in pb.known:
        return ("input", k, pa.known.get(x) or pb.known.get(y))
    if x in pa.computed and y in pb.computed:
        return ("order", k, None)
    if a.get("via") == "DataLoader":
        return ("dataloader", k, None)
    return ("host_data", k, None)


def _add(found: dict[tuple[str, str, str], dict[str, Any]],
         source: tuple[str, int | None, str | None], a: dict[str, Any], index: int,
         tensors: dict[str, Any], environ: dict[str, str]) -> None:
    kind, position, name = source
    key = (a["op"], a["module"], a["phase"])
    if key in found:
        found[key]["count"] += 1
        return
    recipe, advice = RECIPES[kind]
    if kind == "order" and environ.get("PYTHONHASHSEED") not in (None, "", "random"):
        advice += f" (PYTHONHASHSEED is {environ['PYTHONHASHSEED']} here)"
    entry: dict[str, Any] = {"op": a["op"], "module": a["module"], "phase": a["phase"],
                             "index": index, "count": 1, "source": kind,
                             "what": WHAT[kind], "recipe": recipe, "advice": advice}
    if position is not None:
        ref = a["in"][position]
        described = tensors.get(ref)
        entry["input"] = {"position": position,
                          "dtype": described[0] if described else None,
                          "shape": described[1] if described else None}
        if name:
            entry["input"]["name"] = name
    if a.get("at"):
        entry["at"] = a["at"]
    if a.get("via"):
        entry["via"] = a["via"]
    found[key] = entry
