"""GET /metrics: what Prometheus scrapes, read back with prometheus_client's own parser."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers.documents import at, audit_document, run_document
from helpers.processes import (
    run_cli,
    start_server,
    stop_process,
    wait_ready,
)
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from numparity_server.app import create_app
from numparity_server.auth import service as auth_service
from numparity_server.kit import migrate
from numparity_server.kit.db import dispose_engine, get_engine, session_factory
from numparity_server.kit.settings import Settings
from numparity_server.models import Node

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
OUTCOMES = ("created", "replayed", "rejected", "error")
STATUSES = ("ok", "suspect", "watch", "nondeterministic", "stale")


class Scrape:
    """One exposition, as samples: ``value("numparity_nodes", status="ok")``."""

    def __init__(self, text: str) -> None:
        self.families = list(text_string_to_metric_families(text))
        self.samples = {(sample.name, frozenset(sample.labels.items())): sample.value
                        for family in self.families for sample in family.samples}

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: value for (found, labels), value in self.samples.items()
                if found == name}

    def names(self) -> set[str]:
        return {name for name, _labels in self.samples}


def scrape(api: Any, headers: dict[str, str] | None = None) -> Scrape:
    response = api.client.get("/metrics", headers=api.reader if headers is None else headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    return Scrape(response.text)


# -- the ingest path's counters -----------------------------------------------------------

def ingest_figures(found: Scrape) -> dict[str, float]:
    figures = {outcome: found.value("numparity_runs_ingested_total", outcome=outcome)
               for outcome in OUTCOMES}
    figures["uploads timed"] = found.value("numparity_ingest_duration_seconds_count")
    figures["seconds"] = found.value("numparity_ingest_duration_seconds_sum")
    return figures


def test_uploads_are_counted_by_outcome_and_timed(api):
    # The counters belong to the process (other tests' uploads are in them): differences.
    before = ingest_figures(scrape(api))
    documents = [run_document(f"node-{i}") for i in range(3)]
    for document in documents:
        assert api.post_run(document).status_code == 201
    assert api.post_run(documents[0]).status_code == 200
    invalid = run_document("node-9")
    invalid["results"][0]["status"] = "exploded"
    assert api.post_run(invalid).status_code == 422
    other = run_document("node-0", run_id=documents[0]["run_id"], shift=1e-3)
    assert api.post_run(other).status_code == 409
    # Refused tokens are refusals too (the agent moves such a run aside, as for any 4xx).
    assert api.client.post("/api/v1/runs", json=run_document()).status_code == 401
    assert api.client.post("/api/v1/runs", json=run_document(),
                           headers=api.reader).status_code == 403
    # Other routes are not counted.
    assert api.client.get("/api/v1/runs", headers=api.reader).status_code == 200
    found = scrape(api)
    after = ingest_figures(found)

    delta = {name: after[name] - before[name] for name in after}
    assert {name: delta[name] for name in (*OUTCOMES, "uploads timed")} == {
        "created": 3, "replayed": 1, "rejected": 4, "error": 0, "uploads timed": 8}
    assert 0 < delta["seconds"] < 8 * 10
    buckets = sorted(((float(dict(labels)["le"]), value) for labels, value in
                      found.series("numparity_ingest_duration_seconds_bucket").items()))
    assert [le for le, _ in buckets] == [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                                         5.0, 10.0, float("inf")]
    counts = [value for _, value in buckets]
    assert counts == sorted(counts) and counts[-1] == after["uploads timed"]


def test_an_upload_the_database_cannot_take_is_an_error(api):
    before = ingest_figures(scrape(api))
    broken = Settings(database_url="sqlite:////nonexistent-directory/numparity.db")
    with TestClient(create_app(broken)) as client:
        response = client.post("/api/v1/runs", json=run_document(),
                               headers={"Authorization": "Bearer np_some-token"})
    assert response.status_code == 503
    after = ingest_figures(scrape(api))
    assert {outcome: after[outcome] - before[outcome] for outcome in OUTCOMES} == {
        "created": 0, "replayed": 0, "rejected": 0, "error": 1}


# -- the fleet, from the database ---------------------------------------------------------

def test_nodes_by_status_are_the_audits(make_api):
    api = make_api(metrics_cache_seconds=0)
    documents = [
        *(audit_document(f"peer-{i}", 2) for i in (1, 2, 3)),
        audit_document("drilled", 3, shift=1e-3, drill=True),  # disagrees twice: suspect
        audit_document("drilled", 2, shift=1e-3, drill=True),
        audit_document("glitchy", 3, shift=1e-3),  # disagreed once: watch
        audit_document("glitchy", 2),
        audit_document("flaky", 2, env_vars={"MKL_CBWR": "COMPATIBLE"}, repeats_agree=False),
        audit_document("gone", 80),
    ]
    for document in documents:
        assert api.post_run(document).status_code == 201
    # No upload for three days (the policy's default: stale after 48 h).
    with session_factory(get_engine(api.settings))() as session:
        session.execute(update(Node).where(Node.name == "gone")
                        .values(last_seen=datetime.now(timezone.utc) - timedelta(days=3)))
        session.commit()

    summary = api.client.get("/api/v1/audit", headers=api.reader).json()["summary"]
    found = scrape(api)
    by_status = {dict(labels)["status"]: value
                 for labels, value in found.series("numparity_nodes").items()}
    assert by_status == {status: summary[status] for status in STATUSES}
    assert (by_status["suspect"], by_status["watch"], by_status["stale"]) == (1, 1, 1)
    assert by_status["nondeterministic"] >= 1 and by_status["ok"] >= 3
    assert found.value("numparity_fleet_nodes") == summary["nodes"] == 7
    assert found.value("numparity_fleet_environments") == summary["environments"] == 2


def test_every_status_is_reported_on_an_empty_server(api):
    found = scrape(api)
    assert {dict(labels)["status"]: value for labels, value in
            found.series("numparity_nodes").items()} == dict.fromkeys(STATUSES, 0)
    assert found.value("numparity_fleet_nodes") == 0
    assert found.series("numparity_groups") == {}
    assert found.series("numparity_node_last_run_age_seconds") == {}


def versioned(document: dict[str, Any], version: int) -> dict[str, Any]:
    for result in document["results"]:
        result["workload_version"] = version
    return document


@pytest.fixture
def split_fleet(api):
    mkl = {"MKL_CBWR": "COMPATIBLE"}
    two = ("cnn", "mlp")
    documents = [
        # cnn and mlp: two groups (MKL_CBWR), and a node on other input bytes left out.
        run_document("stock-1", workloads=two, variants=("default", "strict")),
        run_document("stock-2", workloads=two, variants=("default", "strict")),
        run_document("mkl-1", workloads=two, variants=("default",), shift=1e-3, env_vars=mkl),
        run_document("broken", workloads=("cnn",), shift=2e-3, input_hash="in-" + "1" * 61),
        # As many nodes on one input as on another: /divergence keeps the first node's
        # (a-1), under which a-1 and a-2 disagree; b-1 and b-2 agree.
        run_document("a-1", workloads=("tied",)),
        run_document("a-2", workloads=("tied",), shift=1e-3, env_vars=mkl),
        run_document("b-1", workloads=("tied",), input_hash="in-" + "2" * 61),
        run_document("b-2", workloads=("tied",), input_hash="in-" + "2" * 61),
        # Only the newest workload version is compared.
        versioned(run_document("v1-node", workloads=("versioned",), shift=1e-3), 1),
        versioned(run_document("v2-node-1", workloads=("versioned",)), 2),
        versioned(run_document("v2-node-2", workloads=("versioned",)), 2),
    ]
    for document in documents:
        assert api.post_run(document).status_code == 201
    return api


def test_groups_are_the_divergence_groups_of_whole_results(split_fleet):
    found = scrape(split_fleet)
    groups = {(labels["suite"], labels["workload"], labels["variant"]): value
              for labels, value in ((dict(pairs), value) for pairs, value in
                                    found.series("numparity_groups").items())}
    # tf32 was skipped everywhere: nothing to group, no series (and /divergence is 404).
    assert groups == {
        ("standard", "cnn", "default"): 2, ("standard", "cnn", "strict"): 1,
        ("standard", "mlp", "default"): 2, ("standard", "mlp", "strict"): 1,
        ("standard", "tied", "default"): 2, ("standard", "versioned", "default"): 1,
    }
    for (suite, workload, variant), count in groups.items():
        response = split_fleet.client.get(
            "/api/v1/divergence", headers=split_fleet.reader,
            params={"suite": suite, "workload": workload, "variant": variant})
        assert response.status_code == 200, response.text
        assert len(response.json()["groups"]) == count, (workload, variant)
    assert split_fleet.client.get(
        "/api/v1/divergence", headers=split_fleet.reader,
        params={"workload": "cnn", "variant": "tf32"}).status_code == 404


def test_age_of_each_nodes_newest_run(make_api):
    api = make_api(metrics_cache_seconds=0)
    before = datetime.now(timezone.utc)
    assert api.post_run(run_document("fresh", started_at=at(1))).status_code == 201
    assert api.post_run(run_document("old", started_at=at(30))).status_code == 201
    # A run from the spool arriving late does not make the node look older.
    assert api.post_run(run_document("fresh", started_at=at(5))).status_code == 201
    expected = {"fresh": 3600, "old": 30 * 3600}
    ages = {dict(labels)["node"]: value for labels, value in
            scrape(api).series("numparity_node_last_run_age_seconds").items()}
    elapsed = (datetime.now(timezone.utc) - before).total_seconds()
    assert ages.keys() == expected.keys()
    for node, age in ages.items():
        assert expected[node] <= age <= expected[node] + elapsed + 1, node


def test_ages_of_a_large_fleet_are_a_histogram_and_the_oldest_nodes(make_api, monkeypatch):
    """Every node is in the histogram's buckets; only the oldest few get a series each
    (a series per node of a 100,000-node lab would be the whole scrape)."""
    from numparity_server.metrics import service as metrics_service

    monkeypatch.setattr(metrics_service, "OLDEST_NODES", 3)
    api = make_api(metrics_cache_seconds=0)
    hours = {"n-a": 0.5, "n-b": 3, "n-c": 12, "n-d": 30, "n-e": 60, "n-f": 200, "n-g": 900}
    for name, ago in hours.items():
        assert api.post_run(run_document(name, started_at=at(ago))).status_code == 201
    found = scrape(api)
    buckets = {dict(labels)["le"]: value for labels, value in
               found.series("numparity_fleet_last_run_age_seconds_bucket").items()}
    expected = {str(int(bucket)): sum(1 for ago in hours.values() if ago * 3600 <= bucket)
                for bucket in metrics_service.AGE_BUCKETS}
    assert buckets == {**expected, "+Inf": len(hours)}
    assert list(expected.values()) == [1, 2, 3, 4, 5, 6]  # each bucket adds one node
    ages = {dict(labels)["node"] for labels in
            found.series("numparity_node_last_run_age_seconds")}
    assert ages == {"n-e", "n-f", "n-g"}


def test_fleet_figures_are_read_at_most_every_metrics_cache_seconds(make_api):
    cached, uncached = make_api(metrics_cache_seconds=3600), make_api(metrics_cache_seconds=0)
    assert cached.post_run(run_document("node-1")).status_code == 201
    assert scrape(cached).value("numparity_fleet_nodes") == 1
    before = scrape(cached).value("numparity_runs_ingested_total", outcome="created")
    assert cached.post_run(run_document("node-2")).status_code == 201
    again = scrape(cached)
    assert again.value("numparity_fleet_nodes") == 1  # the cached figure
    # The process counters are never cached.
    assert again.value("numparity_runs_ingested_total", outcome="created") == before + 1
    assert scrape(uncached).value("numparity_fleet_nodes") == 2


def test_metrics_follow_the_read_rules(make_api):
    closed = make_api()
    response = closed.client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert closed.client.get("/metrics", headers=closed.agent).status_code == 403
    assert closed.client.get("/metrics", headers=closed.reader).status_code == 200
    assert make_api(open_reads=True).client.get("/metrics").status_code == 200


def test_metrics_are_not_part_of_the_api(api):
    paths = api.client.get("/openapi.json").json()["paths"]
    assert "/metrics" in paths and "/api/v1/metrics" not in paths


# -- several processes --------------------------------------------------------------------

_UPLOADER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from fastapi.testclient import TestClient
    from helpers.documents import at, audit_document, run_document
    from numparity_server.app import create_app
    from numparity_server.kit.settings import Settings

    client = TestClient(create_app(Settings(database_url=sys.argv[2])))
    headers = {"Authorization": "Bearer " + sys.argv[3]}
    for i in range(int(sys.argv[4])):
        assert client.post("/api/v1/runs", json=run_document(f"{sys.argv[5]}-{i}"),
                           headers=headers).status_code == 201
    assert client.post("/api/v1/runs", json={"schema": "numparity.run/v1"},
                       headers=headers).status_code == 422
    if sys.argv[6] == "scrape":
        print(client.get("/metrics", headers=headers).text)
""")


def test_multiprocess_mode_sums_every_process(tmp_path):
    """Processes sharing PROMETHEUS_MULTIPROC_DIR: a scrape of one reports them all."""
    url = f"sqlite:///{tmp_path / 'numparity.db'}"
    migrate.upgrade(url)
    with session_factory(get_engine(Settings(database_url=url)))() as session:
        token = auth_service.create_token(session=session, role="agent", label="t").token
    dispose_engine(url)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
           "NUMPARITY_OPEN_READS": "1"}
    here = str(Path(__file__).resolve().parents[2])  # tests/, where helpers/ is

    def run(count: int, name: str, then: str) -> str:
        done = subprocess.run([sys.executable, "-c", _UPLOADER, here, url, token, str(count),
                               name, then], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run(2, "first", "")
    run(3, "second", "")
    found = Scrape(run(1, "third", "scrape"))
    assert found.value("numparity_runs_ingested_total", outcome="created") == 6
    assert found.value("numparity_runs_ingested_total", outcome="rejected") == 3
    assert found.value("numparity_ingest_duration_seconds_count") == 9
    assert found.value("numparity_fleet_nodes") == 6


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _workers(pid: int) -> list[int]:
    """uvicorn's worker processes of the server ``pid`` (multiprocessing's spawned children)."""
    return [child for child in _children(pid)
            if b"spawn_main" in (Path("/proc") / str(child) / "cmdline").read_bytes()]


def _environment_of(pid: int) -> dict[str, str]:
    raw = (Path("/proc") / str(pid) / "environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


@pytest.fixture
def two_workers(migrated_database_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if not migrated_database_url.startswith("postgresql"):
        pytest.skip("several workers need PostgreSQL (serve refuses --workers 2 on SQLite)")
    if not Path("/proc/self/environ").exists():
        pytest.skip("finds the workers' PROMETHEUS_MULTIPROC_DIR in /proc (Linux)")
    log_path = tmp_path / "server.log"
    env = {key: value for key, value in os.environ.items()
           if key not in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")}
    env["NUMPARITY_DATABASE_URL"] = migrated_database_url
    env["NUMPARITY_METRICS_CACHE_SECONDS"] = "0"
    process, base_url = start_server(log_path, env, "--workers", "2", "--log-level", "warning")
    server: dict[str, Any] = {"base_url": base_url, "process": process,
                              "log": log_path}
    try:
        for role in ("agent", "reader"):
            server[role] = run_cli("token", "create", "--role", role,
                                   database_url=migrated_database_url).stdout.strip()
        wait_ready(server["base_url"], process, log_path)
        yield server
    finally:
        stop_process(process, timeout=30)


def test_two_workers_report_the_sum_of_both(two_workers):
    """`serve --workers 2`: whichever worker answers the scrape counts every upload."""
    from prometheus_client.multiprocess import MultiProcessCollector

    base_url = two_workers["base_url"]
    workers = _workers(two_workers["process"].pid)
    assert len(workers) == 2, two_workers["log"].read_text()

    agent = {"Authorization": f"Bearer {two_workers['agent']}"}
    reader = {"Authorization": f"Bearer {two_workers['reader']}"}
    barrier = threading.Barrier(12)

    def upload(index: int) -> int:
        # A client (a connection) each, released together: both workers take some.
        with httpx.Client(base_url=base_url, headers=agent, timeout=60) as client:
            barrier.wait()
            return client.post("/api/v1/runs", json=run_document(f"node-{index}")).status_code

    with ThreadPoolExecutor(12) as pool:
        assert list(pool.map(upload, range(12))) == [201] * 12

    def created(found: Scrape) -> float:
        return found.value("numparity_runs_ingested_total", outcome="created")

    # The counter moves as the answer goes out: wait for the last one, then every scrape,
    # on a connection of its own, whichever worker takes it, reports all twelve.
    deadline = time.monotonic() + 10
    while created(found := Scrape(httpx.get(f"{base_url}/metrics", headers=reader,
                                            timeout=30).text)) < 12:
        assert time.monotonic() < deadline, found.samples
        time.sleep(0.05)
    with ThreadPoolExecutor(4) as pool:
        scrapes = list(pool.map(
            lambda _: Scrape(httpx.get(f"{base_url}/metrics", headers=reader,
                                       timeout=30).text), range(12)))
    for found in scrapes:
        assert created(found) == 12
        assert found.value("numparity_ingest_duration_seconds_count") == 12
        assert found.value("numparity_fleet_nodes") == 12

    # Each worker's own files in the directory `serve` made: the scrape is their sum.
    (metrics_dir,) = {_environment_of(pid)["PROMETHEUS_MULTIPROC_DIR"] for pid in workers}
    per_worker = {}
    for pid in workers:
        files = [str(path) for path in Path(metrics_dir).glob(f"*_{pid}.db")]
        merged = MultiProcessCollector.merge(files)
        per_worker[pid] = sum(sample.value for metric in merged for sample in metric.samples
                              if sample.name == "numparity_runs_ingested_total"
                              and sample.labels.get("outcome") == "created")
    assert sum(per_worker.values()) == 12, per_worker

    # `serve` removes the directory it made when it stops.
    two_workers["process"].send_signal(signal.SIGTERM)
    two_workers["process"].wait(timeout=30)
    assert not Path(metrics_dir).exists()


# -- deploy/ ------------------------------------------------------------------------------

PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "rate", "irate", "increase",
    "histogram_quantile", "topk", "bottomk", "sort", "sort_desc", "time", "label_values",
    "job", "le", "node", "status", "outcome", "suite", "workload", "variant",
}


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [variable["query"]["query"] for variable in dashboard["templating"]["list"]
              if variable["type"] == "query"]
    return exprs


def test_the_grafana_dashboard_queries_only_what_metrics_exposes(split_fleet):
    dashboard = json.loads((DEPLOY / "grafana" / "numparity-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["title"] == "numparity"
    (datasource,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert datasource["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    exposed = scrape(split_fleet).names()
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Runs ingested by outcome", "Ingest latency", "Nodes by status",
            "Groups per workload and variant"} <= titles
    used = set()
    for expr in _exprs(dashboard):
        # Every identifier is PromQL, a label, a Grafana variable, or an exposed series.
        text = re.sub(r'"[^"]*"|\$\w+|\[[^\]]*\]', " ", expr)
        names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)) - PROMQL_WORDS
        assert names, expr
        assert names <= exposed, (expr, names - exposed)
        used |= names
    assert {"numparity_runs_ingested_total", "numparity_ingest_duration_seconds_bucket",
            "numparity_nodes", "numparity_groups",
            "numparity_node_last_run_age_seconds"} <= used
    quantiles = [e for e in _exprs(dashboard) if e.startswith("histogram_quantile")]
    assert {e.split(",")[0] for e in quantiles} == {"histogram_quantile(0.5",
                                                   "histogram_quantile(0.99"}
    assert all("numparity_ingest_duration_seconds_bucket" in e and "rate(" in e
               for e in quantiles)


def test_the_prometheus_example_scrapes_metrics_with_a_token():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"]
    assert job["static_configs"][0]["targets"]


def test_groups_of_keys_a_node_made_up_are_bounded(make_api, monkeypatch):
    """A token may send any workload name: only the GROUP_KEYS keys held by the most
    devices get a series each; the rest are one series (their largest number of
    groups) and a count (issue 30, finding 6: 40 uploads added 9,472 series)."""
    from numparity_server.metrics import service as metrics_service

    monkeypatch.setattr(metrics_service, "GROUP_KEYS", 5, raising=False)
    api = make_api(metrics_cache_seconds=0)
    honest = ("cnn", "mlp")
    for i in range(3):
        document = run_document(f"honest-{i}", workloads=honest, variants=("default", "strict"))
        assert api.post_run(document).status_code == 201
    with session_factory(get_engine(api.settings))() as session:
        token = auth_service.create_token(session=session, role="agent", label="hostile",
                                          node_names=["hostile"]).token
    hostile = {"Authorization": f"Bearer {token}"}
    for i in range(3):
        made_up = tuple(f"made-up-{i}-{j}" for j in range(4))
        response = api.client.post("/api/v1/runs", headers=hostile, json=run_document(
            "hostile", workloads=made_up, shift=1e-3 * i, started_at=at(3 - i)))
        assert response.status_code == 201, response.text
    # Another node answers one made-up key differently: that key has two groups.
    assert api.post_run(run_document("honest-0", workloads=("made-up-0-0",), shift=0.5,
                                     started_at=at(0.5))).status_code == 201
    found = scrape(api)
    series = {(labels["suite"], labels["workload"], labels["variant"]): value
              for labels, value in ((dict(pairs), value) for pairs, value in
                                    found.series("numparity_groups").items())}
    # The four keys every honest node holds, the made-up key two nodes hold, the rest as
    # one series: the largest number of groups among them (1: each is one node's).
    assert series == {
        ("standard", "cnn", "default"): 1, ("standard", "cnn", "strict"): 1,
        ("standard", "mlp", "default"): 1, ("standard", "mlp", "strict"): 1,
        ("standard", "made-up-0-0", "default"): 2,
        ("", "", ""): 1,
    }
    assert found.value("numparity_group_keys") == 4 + 12
    assert found.value("numparity_group_keys_unlisted") == 11
