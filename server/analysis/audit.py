"""The audit's judgements over plain rows (design §3.3): suspect hardware, nondeterminism.

Suspect hardware: in the ``strict`` variant every device of one model on one ``env_key``
must compute the same bits. The majority answer of a key is the manifest held by more
than half of those devices (their latest results; a node's eight GPUs are eight of
them). A device whose ``strict`` manifest differs from it, while it has at least
``min_peers`` peers, disagreed in that run; disagreeing in two or more runs makes it
``suspect``, once ``watch``, and its node takes the worst status of its devices. Runs
marked as drills (``run --fault-drill``) count like any other, and the entry says they
were drills.

Nondeterminism: a result whose repeats disagree, or a node whose ``strict`` answer for
a key changed while its environment did not (drills left out).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from .consensus import Support, in_voters, judges, tally, usual

# (suite, workload, workload_version, device model): what makes two strict results
# comparable.
Key = tuple[str, str, "int | None", str]

SUSPECT_RUNS = 2  # disagreeing runs (of one key) that make a node suspect rather than watched


@dataclass(frozen=True)
class Majority:
    manifest_hash: str
    holders: int  # voters holding the majority answer
    nodes: int  # voters of the environment with a result for the key
    # The nodes whose devices hold the majority answer (empty: not read, where no device
    # disagrees with it). A majority of one node's devices judges only that node's.
    from_nodes: tuple[str, ...] = ()

    def judges_node(self, node: str) -> bool:
        """Whether this majority may judge a device of ``node``: one node's devices
        alone (a node's eight GPUs) judge that node's devices only, so a node that
        reports many devices cannot outvote the others on its own evidence."""
        return len(self.from_nodes) != 1 or self.from_nodes[0] == node


@dataclass(frozen=True)
class VoterRow:
    """Latest strict results of one answer of one node: ``stable`` devices (known by a
    UUID or serial) each a voter; all its ``unstable`` ones (known by slot only, or a
    claim of another node's device) together one voter."""

    manifest_hash: str
    node: str
    stable: int
    unstable: int


def voter_majority(rows: Iterable[VoterRow]) -> Majority:
    """The usual answer of one (environment, key) counted in voters (design §3.3.12,
    ``consensus.in_voters``): a node cannot multiply its vote by reporting devices
    without a stable identity."""
    rows = list(rows)
    answers = in_voters(
        tally((row.manifest_hash, Support(row.stable + row.unstable, row.node))
              for row in rows),
        _per_node((row.manifest_hash, row.node, row.unstable) for row in rows))
    chosen = usual(answers)
    assert chosen is not None
    return Majority(chosen, answers[chosen].nodes,
                    sum(support.nodes for support in answers.values()),
                    tuple(sorted({row.node for row in rows
                                  if row.manifest_hash == chosen})))


def _per_node(rows: Iterable[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """(answer, node, devices) rows added up per (answer, node)."""
    found: dict[tuple[str, str], int] = defaultdict(int)
    for answer, node, devices in rows:
        found[(answer, node)] += devices
    return [(answer, node, devices) for (answer, node), devices in found.items()]


def usual_answers(rows: Iterable[tuple[int, Key, str, Support]]
                  ) -> dict[tuple[int, Key], Majority]:
    """``(environment, key, manifest, support)`` rows → the usual answer of each
    (environment, key), by the consensus rule (``consensus.usual``)."""
    by_env: dict[tuple[int, Key], list[tuple[str, Support]]] = defaultdict(list)
    for environment, key, manifest, support in rows:
        by_env[(environment, key)].append((manifest, support))
    found = {}
    for env_key, holders in by_env.items():
        answers = tally(holders)
        chosen = usual(answers)
        assert chosen is not None
        found[env_key] = Majority(chosen, answers[chosen].nodes,
                                  sum(support.nodes for support in answers.values()))
    return found


def majorities(usual: Mapping[tuple[int, Key], Majority], *, min_peers: int
               ) -> dict[tuple[int, Key], Majority]:
    """The usual answers that judge their environment (``consensus.judges``: more than
    half of its nodes give it and a node there has at least ``min_peers`` peers)."""
    return {env_key: found for env_key, found in usual.items()
            if judges(found.holders, found.nodes, min_peers=min_peers)}


@dataclass(frozen=True)
class Deviation:
    """A device's strict answer that is not its environment's majority answer.

    ``runs`` runs gave ``manifest_hash`` for ``key`` on the device (``drill_runs`` of
    them were drills), on whichever node it sat; ``run_id`` is the newest of them and
    ``slot`` the device's slot in it; ``node`` is where the device sits now.
    """

    device: int
    node: str
    environment: int
    key: Key
    manifest_hash: str
    runs: int
    drill_runs: int
    run_id: str
    slot: str = "cpu"
    newest_at: datetime | None = None  # when the run ``run_id`` started


@dataclass(frozen=True)
class SuspectKey:
    """A key a node disagreed on, and in how many runs."""

    suite: str
    workload: str
    workload_version: int | None
    variant: str  # always strict
    device: str
    runs: int
    drill_runs: int


@dataclass(frozen=True)
class PeerComparison:
    """A run holding the majority answer (``run_a``, on its device ``device_a``) against
    the device's newest disagreeing run (``run_b``, on ``device_b``), on one strict key
    (``device``: the model). Both runs may be one: two GPUs of one node."""

    run_a: str | None
    run_b: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    device_a: str | None
    device_b: str


@dataclass(frozen=True)
class DeviceLabel:
    """What names a device to the person who drains it: its slot on its node now, and
    what identifies it (UUID, serial, PCI bus id) and its name."""

    slot: str
    uuid: str | None
    serial: str | None
    pci_bus_id: str | None
    name: str | None


@dataclass(frozen=True)
class Suspect:
    node: str
    device: str  # its slot on the node (cuda:3, cpu)
    device_uuid: str | None
    device_serial: str | None
    device_pci_bus_id: str | None
    device_name: str | None
    detail: str  # one line: "gpu-node-17 / cuda:3 (UUID …) disagrees with …"
    status: str  # suspect or watch
    env_key: str | None
    peers: int
    majority_nodes: int
    majority_from: list[str]
    disagreeing_runs: int
    drill: bool
    drill_runs: int
    currently_disagrees: bool
    keys: list[SuspectKey]
    compare: PeerComparison


def _strict(key: Key) -> tuple[str, str, int | None, str, str]:
    """(suite, workload, workload_version, variant, device) of a strict key."""
    suite, workload, version, device = key
    return suite, workload, version, "strict", device


def _key_order(key: Key) -> tuple[str, str, int, str]:
    """Keys by suite, workload, version (an unknown version first) and device."""
    suite, workload, version, device = key
    return suite, workload, version or 0, device


def suspect_status(runs: int) -> str:
    return "suspect" if runs >= SUSPECT_RUNS else "watch"


def _judged_by_device(deviations: Iterable[Deviation],
                      majority: Mapping[tuple[int, Key], Majority]
                      ) -> dict[int, list[Deviation]]:
    by_device: dict[int, list[Deviation]] = defaultdict(list)
    for deviation in deviations:
        found = majority.get((deviation.environment, deviation.key))
        if found is not None and found.judges_node(deviation.node):
            by_device[deviation.device].append(deviation)
    return dict(sorted(by_device.items(), key=lambda item: (item[1][0].node, item[0])))


def _runs_by_key(found: Iterable[Deviation]) -> tuple[dict[Key, int], dict[Key, int]]:
    """A device's disagreeing runs and drill runs per key. A corrupting GPU usually spoils
    every workload of a run, so the device's count is its largest per key, not their
    sum."""
    runs: dict[Key, int] = defaultdict(int)
    drills: dict[Key, int] = defaultdict(int)
    for deviation in found:
        runs[deviation.key] += deviation.runs
        drills[deviation.key] += deviation.drill_runs
    return runs, drills


def _worst(runs_by_key: Mapping[Key, int]) -> Key:
    return max(runs_by_key, key=lambda key: (runs_by_key[key], key[1]))


def device_statuses(deviations: Iterable[Deviation],
                    majority: Mapping[tuple[int, Key], Majority]) -> dict[int, tuple[str, str]]:
    """device → (its node, ``suspect`` or ``watch``), as ``classify_suspects`` says,
    without reading which answers are current or which peer runs to compare with."""
    statuses = {}
    for device, found in _judged_by_device(deviations, majority).items():
        runs, _drills = _runs_by_key(found)
        statuses[device] = (found[0].node, suspect_status(runs[_worst(runs)]))
    return statuses


def suspect_statuses(deviations: Iterable[Deviation],
                     majority: Mapping[tuple[int, Key], Majority]) -> dict[str, str]:
    """node → ``suspect`` or ``watch``, the worst of its devices'."""
    statuses: dict[str, str] = {}
    for node, status in device_statuses(deviations, majority).values():
        if statuses.get(node) != "suspect":
            statuses[node] = status
    return statuses


def node_suspect_statuses(suspects: Iterable[Suspect]) -> dict[str, str]:
    """node → the worst status of its suspect devices."""
    statuses: dict[str, str] = {}
    for suspect in suspects:
        if statuses.get(suspect.node) != "suspect":
            statuses[suspect.node] = suspect.status
    return statuses


def describe(node: str, label: DeviceLabel, *, peers: int, runs: int) -> str:
    """"gpu-node-17 / cuda:3 (NVIDIA A100, UUID GPU-…, serial …) disagrees with 41
    identical peers in 2 runs": what a person drains."""
    named = [part for part in (label.name, label.uuid and f"UUID {label.uuid}",
                               label.serial and f"serial {label.serial}") if part]
    where = f"{node} / {label.slot}" + (f" ({', '.join(named)})" if named else "")
    return (f"{where} disagrees with {peers} identical peer{'s' if peers != 1 else ''} "
            f"in {runs} run{'s' if runs != 1 else ''}")


def classify_suspects(deviations: Iterable[Deviation],
                      majority: Mapping[tuple[int, Key], Majority],
                      env_keys: Mapping[int, str],
                      peer_runs: Mapping[tuple[int, Key], tuple[str, str]],
                      current: Collection[tuple[int, int, str]],
                      labels: Mapping[int, DeviceLabel]) -> list[Suspect]:
    """One entry per device that disagreed with its peers: ``suspect`` (2+ runs) or
    ``watch``, by node and slot.

    ``peer_runs`` names a run holding the majority answer of each (environment, key) and
    the slot it holds it on, for a comparison link; ``current`` holds the (device,
    environment, manifest) of the answers that are a device's latest; ``labels`` name
    each device.
    """
    entries = []
    for device, found in _judged_by_device(deviations, majority).items():
        runs_by_key, drills_by_key = _runs_by_key(found)
        worst = _worst(runs_by_key)
        runs = runs_by_key[worst]
        drill_runs = drills_by_key[worst]

        def latest(d: Deviation) -> bool:
            return (d.device, d.environment, d.manifest_hash) in current

        newest = max(found, key=lambda d: (
            latest(d), d.key == worst,
            d.newest_at.timestamp() if d.newest_at else float("-inf"), d.run_id))
        chosen = majority[(newest.environment, newest.key)]
        label, node = labels[device], found[0].node
        peer = peer_runs.get((newest.environment, newest.key))
        entries.append(Suspect(
            node=node, device=label.slot, device_uuid=label.uuid,
            device_serial=label.serial, device_pci_bus_id=label.pci_bus_id,
            device_name=label.name,
            detail=describe(node, label, peers=chosen.nodes - 1, runs=runs),
            status=suspect_status(runs),
            env_key=env_keys.get(newest.environment), peers=chosen.nodes - 1,
            majority_nodes=chosen.holders, majority_from=list(chosen.from_nodes),
            disagreeing_runs=runs, drill=drill_runs > 0,
            drill_runs=drill_runs, currently_disagrees=any(latest(d) for d in found),
            keys=[SuspectKey(*_strict(key), runs=runs_by_key[key],
                             drill_runs=drills_by_key[key])
                  for key in sorted(runs_by_key, key=_key_order)],
            compare=PeerComparison(peer[0] if peer else None, newest.run_id,
                                   *_strict(newest.key), device_a=peer[1] if peer else None,
                                   device_b=newest.slot)))
    return sorted(entries, key=lambda entry: (entry.node, entry.device))


@dataclass(frozen=True)
class StrictChanged:
    """A device whose strict answer for a key changed within one environment
    (``device``: its slot on ``node``)."""

    reason: ClassVar[str] = "strict_changed"
    node: str
    env_key: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    distinct_answers: int
    run_id: str  # the newest run giving one of those answers

    @property
    def detail(self) -> str:
        return f"{self.distinct_answers} different strict answers for {self.workload} " \
               "on one environment"


def strict_changes(rows: Iterable[tuple[str, str, str, Key, int, str]]
                   ) -> list[StrictChanged]:
    """``(node, slot, env_key, key, distinct_manifests, newest_run_id)`` rows of a device
    whose strict answer changed within one environment, by node, slot and key."""
    return [
        StrictChanged(node, env_key, *_strict(key)[:4], slot, distinct_answers=distinct,
                      run_id=run_id)
        for node, slot, env_key, key, distinct, run_id in sorted(
            rows, key=lambda r: (r[0], r[1], *_key_order(r[3])))
    ]


@dataclass(frozen=True)
class RepeatsDisagree:
    """A latest result whose repeats gave different bits."""

    reason: ClassVar[str] = "repeats_disagree"
    node: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    repeats: int
    run_id: str

    @property
    def detail(self) -> str:
        return (f"the {self.repeats} repeats of {self.workload} under {self.variant} gave "
                "different bits")


def repeat_disagreements(rows: Iterable[RepeatsDisagree]) -> list[RepeatsDisagree]:
    """Latest results whose repeats disagree, by node, suite, workload, variant, device."""
    return sorted(rows, key=lambda r: (r.node, r.suite, r.workload, r.variant, r.device))
