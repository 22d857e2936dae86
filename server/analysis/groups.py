"""Divergence groups: the members of one comparison key, grouped by a tensor's hash."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from . import consensus


@dataclass(frozen=True)
class Member:
    """One device's latest result for the key (a node's CPU, or one of its GPUs).

    ``tensors`` is the result's manifest: ``(name, kind, hash)`` in execution order;
    ``device`` the slot it ran on (``cuda:3``; ``cpu``).
    """

    node: str
    run_id: str
    env_key: str
    environment: dict[str, Any] = field(hash=False)
    tensors: tuple[tuple[str, str, str], ...] = ()
    device: str = "cpu"
    trace: str | None = None  # the hash of the result's op trace, when it was traced
    # The manifest hash as stored (``manifest_digest`` of ``tensors``), when known: a
    # fleet of 10,000 members is grouped without hashing 10,000 manifests again.
    manifest: str | None = None
    # The device's model as ingest records it ("cpu", "cuda/NVIDIA H200/9.0"); "" when
    # not known (then its type, from the slot).
    model: str = ""

    @property
    def device_model(self) -> str:
        return self.model or ("cpu" if self.device == "cpu" else self.device.split(":")[0])

    @property
    def manifest_hash(self) -> str:
        return self.manifest if self.manifest is not None else manifest_digest(self.tensors)

    def tensor_hash(self, name: str) -> str | None:
        return hash_of(self.tensors, name)


@dataclass(frozen=True)
class Counted:
    """What a group holds beyond the members it lists, when it lists only the first of
    them (a fleet read from its counts): how many members, how many not on a node's CPU,
    members per environment and those environments' documents."""

    size: int
    devices: int
    env_counts: Mapping[str, int] = field(hash=False)
    environments: Mapping[str, dict[str, Any]] = field(hash=False)
    model_counts: Mapping[str, int] = field(default_factory=dict, hash=False)
    voters: int | None = None  # ``consensus.in_voters``; None: one a member


@dataclass(frozen=True)
class Group:
    """One answer of the key and the members giving it: all of them, or with ``counted``
    the first ones by node name (and ``counted`` says how many there are in all)."""

    id: int
    hash: str
    members: tuple[Member, ...]
    counted: Counted | None = None
    # Some result giving this answer had repeats that disagree (design §3.3.16): the
    # answer is one draw of a nondeterministic computation, not an environment's.
    nondeterministic: bool = False

    @property
    def nodes(self) -> list[str]:
        return sorted(member.node for member in self.members)

    @property
    def size(self) -> int:
        return self.counted.size if self.counted else len(self.members)

    @property
    def voters(self) -> int:
        """Voters giving this answer (design §3.3.12): a node's devices without a stable
        identity are one."""
        if self.counted and self.counted.voters is not None:
            return self.counted.voters
        return self.size

    @cached_property
    def env_counts(self) -> Mapping[str, int]:
        """Members per environment (env_key)."""
        if self.counted:
            return self.counted.env_counts
        return Counter(member.env_key for member in self.members)

    @cached_property
    def model_counts(self) -> Mapping[str, int]:
        """Members per device model ("cpu", "cuda/NVIDIA H200/9.0"): what tells devices of
        one environment apart (a host's GPU and its CPU, two GPU models of a node)."""
        if self.counted:
            return self.counted.model_counts
        return Counter(member.device_model for member in self.members)

    @cached_property
    def environments(self) -> Mapping[str, dict[str, Any]]:
        """env_key → the environment's document, for every environment of the group."""
        if self.counted:
            return self.counted.environments
        return {member.env_key: member.environment for member in self.members}

    @cached_property
    def semantics(self) -> str:
        """"cuda" when every member computed on a CUDA device, else "cpu" (closeness):
        two such groups are judged in CUDA's isclose arithmetic."""
        if self.counted:
            on_cuda = self.counted.size > 0 and self.counted.devices == self.counted.size
        else:
            on_cuda = all(member.device.startswith("cuda") for member in self.members)
        return "cuda" if on_cuda else "cpu"

    @cached_property
    def representative(self) -> Member:
        """The member with the first node name (then run id, device): stable across
        queries."""
        return min(self.members,
                   key=lambda member: (member.node, member.run_id, member.device))

    def to_dict(self, members_limit: int | None = None, members_offset: int = 0
                ) -> dict[str, Any]:
        """``size`` counts devices; ``nodes`` names each member's node (a node twice when
        two of its GPUs are in the group); ``devices`` names the members that are not a
        node's CPU, by node and slot (empty on a CPU fleet). With ``members_limit`` the
        lists keep that many from ``members_offset`` (the answer's size then depends on
        the page, not on the fleet), each with its ``*_total``."""
        representative = self.representative
        ordered = sorted(self.members, key=lambda m: (m.node, m.device))
        devices = [{"node": member.node, "device": member.device}
                   for member in ordered if member.device != "cpu"]
        env_keys = sorted(self.env_counts)
        cut = members_page(members_limit, members_offset)
        return {
            "id": self.id,
            "hash": self.hash,
            "size": self.size,
            **({"voters": self.voters} if self.counted else {}),
            "nodes": [member.node for member in ordered][cut],
            "nodes_total": self.size,
            "devices": devices[cut],
            "devices_total": self.counted.devices if self.counted else len(devices),
            "env_keys": env_keys[cut],
            "env_keys_total": len(env_keys),
            "representative": {"node": representative.node, "run_id": representative.run_id,
                               "device": representative.device},
            "nondeterministic": self.nondeterministic,
        }


def hash_of(tensors: Sequence[tuple[str, str, str]], name: str) -> str | None:
    """The hash of tensor ``name`` in a manifest's (name, kind, hash), None without it."""
    for tensor_name, _kind, digest in tensors:
        if tensor_name == name:
            return digest
    return None


def members_page(limit: int | None, offset: int = 0) -> slice:
    """The members a list shows: ``limit`` from ``offset`` (every one from it: None)."""
    offset = max(offset, 0)
    return slice(offset, None if limit is None else offset + max(limit, 0))


def manifest_digest(tensors: Sequence[tuple[str, str, str]]) -> str:
    """The manifest hash of a result's (name, kind, hash) in order: sha256 of their compact
    JSON, as the agent and the server compute it."""
    canonical = json.dumps([list(t) for t in tensors], separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def group_members(members: Sequence[Member], tensor: str | None
                  ) -> tuple[list[Group], list[str]]:
    """Groups by the hash of ``tensor`` (None: of the whole result, its manifest), in the
    order of ``consensus.ranked`` (largest first, ties by first node name, then hash); ids
    1..n, so group 1 is the usual answer, the baseline every other group is compared with.

    Also returns the (sorted) nodes whose manifest lacks ``tensor``.
    """
    by_hash: dict[str, list[Member]] = {}
    without: list[str] = []
    for member in members:
        digest = member.manifest_hash if tensor is None else member.tensor_hash(tensor)
        if digest is None:
            without.append(member.node)
        else:
            by_hash.setdefault(digest, []).append(member)
    # Each member (a device) counts once, as /divergence counts the fleet's bytes.
    ordered = consensus.ranked({
        digest: consensus.Support(len(group), min(member.node for member in group))
        for digest, group in by_hash.items()})
    groups = [
        Group(id=index, hash=digest, members=tuple(by_hash[digest]))
        for index, digest in enumerate(ordered, start=1)
    ]
    return groups, sorted(without)


@dataclass(frozen=True)
class Answer:
    """Latest results of one outcome in one environment on one device model, counted
    (a ``latest_counts`` row): what a fleet's /divergence groups without its members.
    ``environment`` is the document, or empty where the caller passes the environments
    flattened (``DivergencePlan.report``'s ``flattened``)."""

    outcome: int
    tensors: tuple[tuple[str, str, str], ...]
    manifest: str
    env_key: str
    environment: dict[str, Any] = field(hash=False)
    environment_id: int = 0
    devices: int = 1
    first_node: str = ""
    slot: str = "cpu"
    model: str = "cpu"  # the device model of these results ("cuda/NVIDIA H200/9.0")
    trace: str | None = None  # the outcome's op trace, when it was traced
    workload_version: int | None = None
    input_hash: str | None = None
    param_hash: str | None = None
    repeats_agree: bool | None = None  # False: the outcome's repeats disagreed

    @property
    def support(self) -> consensus.Support:
        return consensus.Support(self.devices, self.first_node)

    def tensor_hash(self, name: str) -> str | None:
        return hash_of(self.tensors, name)


Crowded = tuple[int, int, str, str, int]  # outcome, environment, model, node, devices


def group_answers(answers: Sequence[Answer], tensor: str | None,
                  crowded: Iterable[Crowded] = ()
                  ) -> tuple[list[tuple[str, list[Answer]]], list[Answer], dict[str, int]]:
    """``group_members`` of counted answers: (hash, its answers) in ``consensus.ranked``
    order, counted in voters (``consensus.in_voters``: ``crowded`` names the devices
    without a stable identity of the nodes that hold several, by answer, as
    (outcome, environment, model, node, devices)); the answers without ``tensor``; and
    each hash's voters."""
    by_hash: dict[str, list[Answer]] = {}
    without: list[Answer] = []
    digest_of: dict[tuple[int, int, str], str] = {}
    for answer in answers:
        digest = answer.manifest if tensor is None else answer.tensor_hash(tensor)
        if digest is None:
            without.append(answer)
        else:
            by_hash.setdefault(digest, []).append(answer)
            digest_of[(answer.outcome, answer.environment_id, answer.model)] = digest
    per_node: Counter[tuple[str, str]] = Counter()
    for outcome, environment, model, node, devices in crowded:
        if (digest := digest_of.get((outcome, environment, model))) is not None:
            per_node[(digest, node)] += devices
    voted = consensus.in_voters(
        {digest: consensus.tally(("", answer.support) for answer in group)[""]
         for digest, group in by_hash.items()},
        [(digest, node, devices) for (digest, node), devices in per_node.items()])
    ordered = consensus.ranked(voted)
    return ([(digest, by_hash[digest]) for digest in ordered], without,
            {digest: support.nodes for digest, support in voted.items()})


def counted(answers: Sequence[Answer], voters: int | None = None) -> Counted:
    """What the members of these answers add up to (``voters``: as ``group_answers``
    counts them; None: one a member)."""
    env_counts: Counter[str] = Counter()
    model_counts: Counter[str] = Counter()
    for answer in answers:
        env_counts[answer.env_key] += answer.devices
        model_counts[answer.model] += answer.devices
    return Counted(size=sum(answer.devices for answer in answers),
                   devices=sum(answer.devices for answer in answers if answer.slot != "cpu"),
                   env_counts=env_counts,
                   environments={answer.env_key: answer.environment for answer in answers},
                   model_counts=model_counts,
                   voters=voters)
