"""The fleet metrics, read from the database at scrape time and kept for a few seconds.

Every server process answers the same (they all read the database), so these need no
multiprocess mode; each process keeps its own copy for ``metrics_cache_seconds``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from numparity_server.analysis import consensus
from numparity_server.analysis.node_status import STATUSES
from numparity_server.analysis.policy import Policy
from numparity_server.audit.schemas import NodeStatusCounts
from numparity_server.audit.service import audit_summary
from numparity_server.kit.ingest_meter import process_metrics
from numparity_server.metrics import repository
from numparity_server.metrics.repository import Key

# The buckets (seconds) of the nodes' newest runs' ages: an hour, 6 hours, a day, two
# (the audit's default stale_after_hours), a week, 30 days.
AGE_BUCKETS = (3600.0, 6 * 3600.0, 24 * 3600.0, 48 * 3600.0, 7 * 86400.0, 30 * 86400.0)
# The nodes whose newest run is oldest get a series each (the dashboard's "longest since
# a run" panel); a series per node of a 100,000-node lab would be the whole scrape.
OLDEST_NODES = 100
# Keys (suite, workload, variant) that get a numparity_groups series each: those held by
# the most devices. Any token may send any workload name, so the keys are the nodes' to
# make up; the rest are one series (issue 30: 40 uploads of made-up names added 9,472
# series). The standard suites hold ~100 keys.
GROUP_KEYS = 200
# The labels of that one series: empty, which no key's are (each name has a character).
OTHER = ""


@dataclass(frozen=True)
class KeyGroups:
    """Distinct whole results (/divergence's groups) per key, for the GROUP_KEYS keys
    held by the most devices (ties by key); of the others, how many and their most."""

    listed: dict[Key, int]
    keys: int = 0  # every key with an ok result
    others_most: int = 0  # the largest number of groups among the keys not listed


@dataclass(frozen=True)
class FleetSnapshot:
    summary: NodeStatusCounts  # nodes, environments, nodes per status
    groups: KeyGroups
    last_runs: list[tuple[str, datetime]]  # the OLDEST_NODES nodes' newest runs
    taken_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    # Nodes whose newest run started within each of AGE_BUCKETS of ``taken_at``, then all.
    age_counts: list[int] = field(default_factory=list)


def fleet_snapshot(*, session: Session, policy: Policy) -> FleetSnapshot:
    now = datetime.now(timezone.utc)
    last_runs = [(row.name, row.started)
                 for row in repository.oldest_last_runs(session, limit=OLDEST_NODES)]
    return FleetSnapshot(summary=audit_summary(session=session, policy=policy),
                         groups=result_groups(session), last_runs=last_runs, taken_at=now,
                         age_counts=repository.last_run_ages(session, now=now,
                                                             buckets=AGE_BUCKETS))


def result_groups(session: Session) -> KeyGroups:
    """Per key, the number of groups ``GET /divergence`` reports without a tensor: distinct
    whole results (manifests) among the nodes' latest ok results of the fleet's workload
    version (``consensus.fleet_version``), leaving out results on other input or
    parameter bytes than the fleet's. Listed for the ``GROUP_KEYS`` keys held by the
    most devices."""
    by_key: dict[Key, list[Any]] = defaultdict(list)
    for row in repository.latest_ok_answers(session):
        by_key[(row.suite, row.workload, row.variant)].append(row)
    held = sorted(by_key, key=lambda key: (-sum(int(row.nodes) for row in by_key[key]), key))
    counts = {key: len({row.manifest_hash for row in _comparable(by_key[key])})
              for key in held}
    return KeyGroups(listed={key: counts[key] for key in sorted(held[:GROUP_KEYS])},
                     keys=len(held),
                     others_most=max((counts[key] for key in held[GROUP_KEYS:]), default=0))


def _comparable(rows: Sequence[Any]) -> list[Any]:
    """The rows /divergence compares (``consensus.comparable``), on rows counting nodes."""
    def support(row: Any) -> consensus.Support:
        return consensus.Support(int(row.nodes), row.first_node)

    kept, _left_out = consensus.comparable(
        rows, version=consensus.fleet_version(rows, support_of=support), support_of=support)
    return kept


class FleetCache:
    """The newest snapshot, recomputed when older than ``seconds``; one at a time, so
    concurrent scrapes of a stale cache wait for one computation instead of each doing it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._snapshot: FleetSnapshot | None = None
        self._taken = 0.0

    def get(self, compute: Callable[[], FleetSnapshot]) -> FleetSnapshot:
        with self._lock:
            if self._snapshot is None or time.monotonic() - self._taken >= self.seconds:
                self._snapshot = compute()
                self._taken = time.monotonic()
            return self._snapshot


def fleet_metrics(snapshot: FleetSnapshot, now: datetime | None = None) -> list[Metric]:
    now = now or datetime.now(timezone.utc)
    nodes = GaugeMetricFamily(
        "numparity_nodes",
        "Nodes by audit status (GET /api/v1/audit's summary): a node can be suspect and "
        "stale at once, ok is a node with none of the others.", labels=["status"])
    for status in STATUSES:
        nodes.add_metric([status], getattr(snapshot.summary, status))
    devices = GaugeMetricFamily(
        "numparity_devices",
        "Devices that sit on a node (a node's CPU, each GPU or MIG instance; status all) "
        "and those the audit finds suspect or watches.", labels=["status"])
    for status, count in (("all", snapshot.summary.devices),
                          ("suspect", snapshot.summary.suspect_devices),
                          ("watch", snapshot.summary.watched_devices)):
        devices.add_metric([status], count)
    groups = GaugeMetricFamily(
        "numparity_groups",
        "Distinct answers (whole results: every tensor) among the nodes' latest results "
        "of a workload and variant (the groups of GET /api/v1/divergence without a "
        f"tensor); 1 is a fleet that agrees bit for bit. For the {GROUP_KEYS} keys held by "
        "the most devices; the others are one series with empty suite, workload and "
        "variant: their largest number of groups.",
        labels=["suite", "workload", "variant"])
    for (suite, workload, variant), count in snapshot.groups.listed.items():
        groups.add_metric([suite, workload, variant], count)
    unlisted = snapshot.groups.keys - len(snapshot.groups.listed)
    if unlisted:
        groups.add_metric([OTHER, OTHER, OTHER], snapshot.groups.others_most)
    ages = GaugeMetricFamily(
        "numparity_node_last_run_age_seconds",
        f"Seconds since the node's newest run started (its started_at), for the "
        f"{OLDEST_NODES} nodes whose newest run started longest ago.", labels=["node"])
    for name, started_at in snapshot.last_runs:
        ages.add_metric([name], (now - started_at).total_seconds())
    histogram = HistogramMetricFamily(
        "numparity_fleet_last_run_age_seconds",
        "The nodes by the age of their newest run (seconds since its started_at) when the "
        "fleet figures were read: every node, in 7 series (one a bucket).")
    if snapshot.age_counts:
        *within, total = snapshot.age_counts
        histogram.add_metric([], [*((str(int(bucket)), count)
                                    for bucket, count in zip(AGE_BUCKETS, within, strict=True)),
                                  ("+Inf", total)], sum_value=None)
    return [
        GaugeMetricFamily("numparity_fleet_nodes", "Nodes known to the server.",
                          value=snapshot.summary.nodes),
        GaugeMetricFamily("numparity_fleet_environments",
                          "Distinct environments (env_key) the nodes' newest runs ran on.",
                          value=snapshot.summary.environments),
        GaugeMetricFamily("numparity_group_keys",
                          "Keys (suite, workload, variant) with an ok latest result.",
                          value=snapshot.groups.keys),
        GaugeMetricFamily("numparity_group_keys_unlisted",
                          f"Keys past the {GROUP_KEYS} held by the most devices: the "
                          'series numparity_groups{workload=""}.', value=unlisted),
        nodes, devices, groups, ages, histogram,
    ]


class _Metrics(Collector):
    def __init__(self, collectors: Iterable[Collector], fleet: Iterable[Metric]) -> None:
        self.collectors = list(collectors)
        self.fleet = list(fleet)

    def collect(self) -> Iterable[Metric]:
        for collector in self.collectors:
            yield from collector.collect()
        yield from self.fleet


def exposition(snapshot: FleetSnapshot) -> bytes:
    """The Prometheus text format of the process metrics and the fleet's."""
    return generate_latest(_Metrics([process_metrics()], fleet_metrics(snapshot)))
