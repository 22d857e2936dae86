"""Pinned answers (design §3.11): which pin an environment falls under, the answers a pin
takes from the fleet's majority, the drift of the fleet from a pin, and what `check`
runs. Pure: plain values in, dataclasses out.

A pin's **scope** is one environment (``{"env_key": K}``) or a software stack: promoted
environment attributes and their values (``{"torch": "2.13.0", "cuda": None, …}``); an
environment is in a stack's scope when every one of its attributes has the pinned value
(None matches only None). The stack pinned by default is the device model's software:
torch, CUDA and cuDNN, and for the CPU its model (two CPU models rightly differ); the
driver, the CPU capability and the numeric settings (``MKL_CBWR``, threads) are left
out, so a rollout that changes them changes the answers *within* the pin's scope and
shows as drift, however many nodes take it together.

Of several pins whose scope holds an environment, the most specific is in force: an
environment's own, then the stack with the most attributes, then the newest pin.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .consensus import Support, comparable, fleet_version, tally, usual

# The promoted attributes a stack may name (``environments``' columns, design §3.1).
STACK_ATTRIBUTES = ("gpu_name", "compute_capability", "driver", "cuda", "cudnn", "torch",
                    "cpu_capability", "cpu_model")
DEFAULT_STACK = ("torch", "cuda", "cudnn")
ENV_KEY = "env_key"
CPU_MODEL = "cpu"

Scope = Mapping[str, str | None]
AnswerKey = tuple[str, str]  # (workload, variant)


class ScopeError(ValueError):
    """A scope that names an attribute a stack cannot have."""


def default_scope(model: str, promoted: Mapping[str, str | None]) -> dict[str, str | None]:
    """The stack of an environment for devices of ``model``: torch, CUDA, cuDNN, and on
    the CPU the CPU's model."""
    names = (*DEFAULT_STACK, "cpu_model") if model == CPU_MODEL else DEFAULT_STACK
    return {name: promoted.get(name) for name in names}


def check_scope(scope: Mapping[str, Any]) -> dict[str, str | None]:
    """``scope`` as stored: an environment's, or a stack of known attributes (sorted)."""
    if ENV_KEY in scope:
        if set(scope) != {ENV_KEY} or not isinstance(scope[ENV_KEY], str):
            raise ScopeError("an environment's scope is {\"env_key\": KEY} alone")
        return {ENV_KEY: scope[ENV_KEY]}
    unknown = sorted(set(scope) - set(STACK_ATTRIBUTES))
    if unknown:
        raise ScopeError(f"unknown stack attribute(s) {', '.join(unknown)}; a stack names "
                         f"{', '.join(STACK_ATTRIBUTES)}")
    if not scope:
        raise ScopeError("a stack names at least one attribute")
    bad = [name for name, value in scope.items() if value is not None
           and not isinstance(value, str)]
    if bad:
        raise ScopeError(f"stack attribute {bad[0]} must be a string or null")
    return {name: scope[name] for name in sorted(scope)}


def subject(suite: str, model: str, scope: Scope) -> str:
    """What the versions of one pin share: sha256 of the canonical JSON of suite, device
    model and scope."""
    canonical = json.dumps({"suite": suite, "model": model, "scope": dict(scope)},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def in_scope(scope: Scope, env_key: str | None, promoted: Mapping[str, str | None]) -> bool:
    if ENV_KEY in scope:
        return env_key is not None and scope[ENV_KEY] == env_key
    return all(promoted.get(name) == value for name, value in scope.items())


def describe_scope(scope: Scope) -> str:
    """A scope in words: ``environment 9f2c41d0a7b3`` or ``torch 2.13.0, cuda none``."""
    if ENV_KEY in scope:
        return f"environment {str(scope[ENV_KEY])[:12]}"
    return ", ".join(f"{name} {value if value is not None else 'none'}"
                     for name, value in scope.items())


@dataclass(frozen=True)
class PinnedAnswer:
    workload: str
    workload_version: int | None
    variant: str
    manifest_hash: str
    input_hash: str | None
    param_hash: str | None


@dataclass(frozen=True)
class Pin:
    """The version of a pin in force (retired subjects have none)."""

    id: int
    version: int
    suite: str
    model: str
    scope: Scope = field(hash=False)
    answers: Mapping[AnswerKey, PinnedAnswer] = field(hash=False)

    @property
    def specificity(self) -> tuple[int, int]:
        return (1 if ENV_KEY in self.scope else 0, len(self.scope))

    def label(self) -> str:
        return f"pin {self.id} (v{self.version}: {self.model}, {describe_scope(self.scope)})"


def pin_in_force(pins: Iterable[Pin], *, suite: str, model: str, env_key: str | None,
                 promoted: Mapping[str, str | None]) -> Pin | None:
    """The pin whose scope holds the environment, for devices of ``model``: the most
    specific (an environment's own, then the stack of most attributes), then the newest."""
    holding = [pin for pin in pins if pin.suite == suite and pin.model == model
               and in_scope(pin.scope, env_key, promoted)]
    return max(holding, key=lambda pin: (pin.specificity, pin.id), default=None)


# ---- the fleet's answers -------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """Latest results of one outcome on devices of one model in one environment (a
    ``latest_counts`` row with its outcome)."""

    environment_id: int
    model: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    status: str
    manifest_hash: str | None
    input_hash: str | None
    param_hash: str | None
    repeats_agree: bool | None
    devices: int
    first_node: str
    wall_s: float | None = None  # the mean wall time of those that have one

    @property
    def support(self) -> Support:
        return Support(self.devices, self.first_node)


# A fleet answer for `check` and for a pin taken from the majority needs this many
# distinct nodes holding it: what one node alone uploads (its devices real or invented,
# its workload versions, its "repeats disagree") never decides another node's check.
MIN_HOLDER_NODES = 2
# The holders' names a pin keeps and `check` shows, of each answer.
NAMED_HOLDERS = 5


@dataclass(frozen=True)
class NodeAnswer:
    """One node's latest results of a key on devices of one model in scope, of one
    outcome (a workload version, input bytes and manifest): how many devices give it,
    how many of them report that their repeats disagree, and their wall times."""

    node: str
    workload: str
    variant: str
    workload_version: int | None
    manifest_hash: str
    input_hash: str | None
    param_hash: str | None
    devices: int
    unsteady: int = 0  # devices whose repeats disagree
    wall_sum: float = 0.0
    walls: int = 0


@dataclass(frozen=True)
class Majority:
    """The answer more than half of the nodes give (of the workload version most nodes
    report, on the fleet's input bytes), held by at least ``MIN_HOLDER_NODES`` nodes;
    None when the nodes split without one, or too few hold it (``note`` says which)."""

    answer: PinnedAnswer | None
    holders: int  # nodes giving it
    devices: int  # nodes with an answer (voters)
    note: str | None = None
    held_by: tuple[str, ...] = ()  # the first holders by name
    holder_devices: int = 0  # the holders' devices giving it
    unsteady: bool = False  # most nodes report that the key's repeats disagree
    wall_s: float | None = None  # the holders' mean wall time

    @property
    def decided(self) -> bool:
        return self.answer is not None


def _node_vote(answers: Sequence[NodeAnswer]) -> NodeAnswer:
    """A node's one vote on a key: the outcome most of its devices give (of a tie, the
    newest version, then the manifest's text), whatever number of devices it reports."""
    return min(answers, key=lambda a: (-a.devices, -(a.workload_version or 0),
                                       a.manifest_hash))


def majority_answers(node_answers: Iterable[NodeAnswer]) -> dict[AnswerKey, Majority]:
    """Per (workload, variant): the fleet's answer where the nodes decide it. Each node
    is one voter (``_node_vote``): invented devices, a workload version or "repeats
    disagree" of one node weigh one vote, never a device's each. The version compared is
    the one most nodes report (a tie: the newest); of it, the nodes on the fleet's input
    bytes (``consensus``'s rule) vote; the usual answer decides when more than half of
    them give it and at least ``MIN_HOLDER_NODES`` do. A key whose repeats disagree on
    most of those nodes has no answer (``unsteady``): its bits are not the device's."""
    by_node: dict[AnswerKey, dict[str, list[NodeAnswer]]] = defaultdict(
        lambda: defaultdict(list))
    for held in node_answers:
        by_node[(held.workload, held.variant)][held.node].append(held)
    found: dict[AnswerKey, Majority] = {}
    for key, nodes in sorted(by_node.items()):
        votes = [_node_vote(answers) for _node, answers in sorted(nodes.items())]
        kept, _left_out = comparable(
            votes, version=fleet_version(votes, support_of=lambda v: Support(1, v.node)),
            support_of=lambda v: Support(1, v.node))
        by_manifest = tally((v.manifest_hash, Support(1, v.node)) for v in kept)
        chosen = usual(by_manifest)
        if chosen is None:
            continue
        total = len(kept)
        holding = [v for v in kept if v.manifest_hash == chosen]
        holders = len(holding)
        held_by = tuple(sorted(v.node for v in holding)[:NAMED_HOLDERS])
        unsteady = 2 * sum(1 for v in kept if v.unsteady) > total
        walls = sum(v.walls for v in holding)
        wall_s = sum(v.wall_sum for v in holding) / walls if walls else None
        first = holding[0]
        answer: PinnedAnswer | None = PinnedAnswer(
            first.workload, first.workload_version, first.variant, chosen,
            first.input_hash, first.param_hash)
        note = None
        if holders < MIN_HOLDER_NODES:
            answer, note = None, (f"held by {holders} node ({held_by[0]}) alone: a fleet "
                                  f"answer needs {MIN_HOLDER_NODES} nodes or more")
        elif 2 * holders <= total:
            answer, note = None, (f"split without a majority: the usual answer is held by "
                                  f"{holders} of {total} nodes")
        found[key] = Majority(answer, holders, total, note, held_by,
                              sum(v.devices for v in holding), unsteady, wall_s)
    return found


# ---- drift from a pin ----------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """Devices of an environment in a pin's scope whose latest answer of a pinned key is
    not the pinned one. ``usual``: the answer is their environment's usual one (the
    peers agree: the fleet moved, not one device)."""

    pin: Pin
    environment_id: int
    workload: str
    workload_version: int | None
    variant: str
    pinned: str  # the pinned manifest
    answer: str  # the manifest they hold
    devices: int
    first_node: str
    environment_devices: int  # devices of the model with an ok result of the key there
    usual: bool


def drift(pins: Sequence[Pin], holdings: Iterable[Holding],
          environments: Mapping[int, tuple[str, Mapping[str, str | None]]]) -> list[Drift]:
    """Each pin against the latest results of the devices in force under it
    (``pin_in_force``: an environment under a more specific pin is that pin's), per
    pinned key of the pinned workload version: the answers that are not the pinned
    one. ``environments``: id → (env_key, promoted attributes)."""
    in_force: dict[tuple[int, str, str], Pin | None] = {}

    def pin_of(environment_id: int, suite: str, model: str) -> Pin | None:
        key = (environment_id, suite, model)
        if key not in in_force:
            env_key, promoted = environments.get(environment_id, (None, {}))
            in_force[key] = pin_in_force(pins, suite=suite, model=model, env_key=env_key,
                                         promoted=promoted)
        return in_force[key]

    by_env: dict[tuple[int, int, AnswerKey], list[Holding]] = defaultdict(list)
    for holding in holdings:
        if holding.status != "ok" or not holding.manifest_hash:
            continue
        pin = pin_of(holding.environment_id, holding.suite, holding.model)
        if pin is None:
            continue
        pinned = pin.answers.get((holding.workload, holding.variant))
        if pinned is None or pinned.workload_version != holding.workload_version:
            continue
        by_env[(pin.id, holding.environment_id, (holding.workload, holding.variant))
               ].append(holding)
    pins_by_id = {pin.id: pin for pin in pins}
    found = []
    for (pin_id, environment_id, key), held in by_env.items():
        pin = pins_by_id[pin_id]
        pinned = pin.answers[key]
        answers = tally((h.manifest_hash or "", h.support) for h in held)
        usual_answer = usual(answers)
        total = sum(support.nodes for support in answers.values())
        for answer, support in answers.items():
            if answer == pinned.manifest_hash:
                continue
            found.append(Drift(pin, environment_id, key[0], pinned.workload_version, key[1],
                               pinned.manifest_hash, answer, support.nodes,
                               support.first_node, total, answer == usual_answer))
    found.sort(key=lambda d: (d.pin.id, d.workload, d.variant, not d.usual, -d.devices,
                              d.first_node))
    return found


# ---- what `check` runs ---------------------------------------------------------------

# A check result is fingerprinted (hashes, statistics, sketches) after it is computed:
# its cost is a multiple of the workload's wall time plus a floor (model building).
CHECK_COST_FACTOR = 2.0
CHECK_COST_FLOOR_S = 0.5
# Variants `check` computes only when the agent names them (the agent's
# `_variants.OPT_IN`): a compiled variant's cold compile takes minutes.
OPT_IN_VARIANTS = frozenset({"compiled"})
MAX_CHECK_KEYS = 6
MAX_CHECK_VARIANTS = 2


@dataclass(frozen=True)
class CheckCandidate:
    """An answer `check` could compare: its key, where it comes from and what it costs."""

    workload: str
    variant: str
    source: str  # "pin" | "fleet"
    wall_s: float | None  # the environment's mean wall time of the key, when known
    split: bool  # the key has more than one answer somewhere in the fleet
    layered: bool  # the result records layers (a flipped bit in one shows)

    def cost(self) -> float:
        return CHECK_COST_FLOOR_S + CHECK_COST_FACTOR * (self.wall_s or 0.0)


# Measured coverage (issue 44, `bench/coverage.py`): per workload, per op class, the share
# of single-bit faults injected into that class's op outputs that changed a recorded bit.
Coverage = Mapping[str, Mapping[str, float]]


def check_rank(c: CheckCandidate) -> tuple[bool, bool, bool, bool, float, str, str]:
    """``choose_checks``'s order without coverage figures: strict, pinned, split,
    layered, cheapest, by name."""
    return (c.variant != "strict", c.source != "pin", not c.split, not c.layered, c.cost(),
            c.workload, c.variant)


def plan_coverage(workloads: Sequence[str], coverage: Coverage) -> float:
    """The share of lasting faults a plan of ``workloads`` is expected to see, from the
    measured per-class shares: a fault of an op class is missed only when every chosen
    workload that runs the class misses it (each workload's chance taken as independent),
    averaged over the classes the suite was measured on, each weighing the same."""
    classes = sorted({c for shares in coverage.values() for c in shares})
    if not classes:
        return 0.0
    total = 0.0
    for op_class in classes:
        missed = 1.0
        for workload in dict.fromkeys(workloads):
            missed *= 1.0 - coverage.get(workload, {}).get(op_class, 0.0)
        total += 1.0 - missed
    return total / len(classes)


def choose_checks(candidates: Sequence[CheckCandidate], *, budget_s: float,
                  child_s: float, max_keys: int = MAX_CHECK_KEYS,
                  max_variants: int = MAX_CHECK_VARIANTS,
                  coverage: Coverage | None = None) -> list[CheckCandidate]:
    """The answers `check` compares on each device, within ``budget_s`` seconds of a
    device (each variant costs a child process, ``child_s``): `strict` first (the
    deterministic variant, where peers must agree bit for bit), then pinned answers and
    keys that split the fleet; within each of those tiers, with ``coverage``, the answer
    that adds the most measured coverage per second (``plan_coverage`` of the answers
    chosen so far: a workload whose classes are already seen adds none and goes after
    those that add some), else results that record layers (where a corrupting device's
    flipped bit shows), and the cheapest. Per second alone can fill a tight budget with
    cheap answers that see little, so the plan taking the most coverage per answer is
    built too and kept when it sees more (budgeted maximum coverage: the better of the
    two greedy plans is within a constant factor of the best). The first is always
    chosen: one answer compared beats none, and the agent's own deadline bounds the
    rest."""
    per_second = _greedy(candidates, budget_s, child_s, max_keys, max_variants, coverage,
                         per_second=True)
    if not coverage:
        return per_second
    per_answer = _greedy(candidates, budget_s, child_s, max_keys, max_variants, coverage,
                         per_second=False)

    def worth(plan: list[CheckCandidate]) -> float:
        return plan_coverage([c.workload for c in plan], coverage or {})

    return per_answer if worth(per_answer) > worth(per_second) + 1e-12 else per_second


def _greedy(candidates: Sequence[CheckCandidate], budget_s: float, child_s: float,
            max_keys: int, max_variants: int, coverage: Coverage | None, *,
            per_second: bool) -> list[CheckCandidate]:
    remaining = sorted(candidates, key=check_rank)
    chosen: list[CheckCandidate] = []
    variants: list[str] = []
    spent = 0.0

    def fits(candidate: CheckCandidate) -> bool:
        new_variant = candidate.variant not in variants
        if new_variant and len(variants) >= max_variants:
            return False
        cost = candidate.cost() + (child_s if new_variant else 0.0)
        return not chosen or spent + cost <= budget_s

    def gain(candidate: CheckCandidate, workloads: list[str], base: float) -> float:
        added = plan_coverage([*workloads, candidate.workload], coverage or {}) - base
        return added / candidate.cost() if per_second else added

    while remaining and len(chosen) < max_keys:
        fitting = [c for c in remaining if fits(c)]
        if not fitting:
            break
        tier = check_rank(fitting[0])[:3]
        best = fitting[0]
        if coverage:
            same_tier = [c for c in fitting if check_rank(c)[:3] == tier]
            workloads = [c.workload for c in chosen]
            base = plan_coverage(workloads, coverage)
            gains = [gain(c, workloads, base) for c in same_tier]
            if max(gains) > 1e-12:
                best = same_tier[gains.index(max(gains))]
        remaining.remove(best)
        if best.variant not in variants:
            variants.append(best.variant)
            spent += child_s
        spent += best.cost()
        chosen.append(best)
    return chosen
