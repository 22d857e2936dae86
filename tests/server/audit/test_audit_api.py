"""GET /api/v1/audit on a hand-made fleet with one of every finding."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone

import pytest
from helpers.documents import at, run_document
from helpers.documents import audit_document as document

from numparity_server.analysis.node_status import STATUSES
from numparity_server.analysis.policy import Policy
from numparity_server.audit import service
from numparity_server.kit.db import get_engine, session_factory


def get_audit(api, **params):
    response = api.client.get("/api/v1/audit", params=params, headers=api.reader)
    assert response.status_code == 200, response.text
    return response


def test_suspect_and_watch_by_majority_within_the_environment(fleet):
    report = get_audit(fleet).json()
    by_node = {entry["node"]: entry for entry in report["suspects"]}
    assert set(by_node) == {"drilled", "glitchy"}
    drilled = by_node["drilled"]
    assert drilled["status"] == "suspect" and drilled["disagreeing_runs"] == 2
    assert drilled["drill"] is True and drilled["drill_runs"] == 2
    assert drilled["currently_disagrees"] is True
    # peers 1-3, glitchy, broken, old: the stock environment's other nodes.
    assert drilled["peers"] == 6 and drilled["majority_nodes"] == 6
    assert drilled["compare"]["run_a"] and drilled["compare"]["workload"] == "cnn"
    glitchy = by_node["glitchy"]
    assert glitchy["status"] == "watch" and glitchy["drill"] is False
    assert glitchy["currently_disagrees"] is False
    assert report["summary"]["suspect"] == 1 and report["summary"]["watch"] == 1


def test_the_compare_link_of_a_suspect_names_a_peer_and_the_suspects_run(fleet):
    report = get_audit(fleet).json()
    (drilled,) = [e for e in report["suspects"] if e["node"] == "drilled"]
    link = drilled["compare"]
    runs = {run["run_id"]: run["node"] for run in fleet.client.get(
        "/api/v1/runs", params={"limit": 100}, headers=fleet.reader).json()["items"]}
    assert runs[link["run_b"]] == "drilled"
    assert runs[link["run_a"]] in {"peer-1", "peer-2", "peer-3", "glitchy", "broken", "old"}


def test_the_audit_states_the_measured_proof_of_catch(fleet):
    """Issue 44: the figures of the benchmarks (the file the agent ships), not the fleet's."""
    import json
    from importlib import resources

    shipped = json.loads(resources.files("numparity_agent").joinpath(
        "proof_of_catch.json").read_text("utf-8"))
    proof = get_audit(fleet).json()["proof"]
    coverage, alarms = shipped["coverage"], shipped["false_alarms"]
    trials = alarms["answer_evaluations"] + alarms["checks"]
    assert proof["plan"] == coverage["plan"]
    assert proof["plan_single_bit_seen"] == coverage["plan_single_bit_seen"]
    assert proof["honest_evaluations"] == trials
    assert proof["false_no_go"] == alarms["answers_differing"] + alarms["check_no_go"]
    if proof["false_no_go"] == 0:
        assert proof["false_no_go_bound"] == round(3 / trials, 6)
        assert f"0 false no-go in {trials} honest evaluations" in proof["statement"]


def test_nondeterministic_nodes(fleet):
    report = get_audit(fleet).json()
    reasons = {(e["node"], e["reason"], e["variant"]) for e in report["nondeterministic"]}
    assert ("flaky", "repeats_disagree", "default") in reasons
    assert ("flaky", "repeats_disagree", "strict") in reasons
    assert ("glitchy", "strict_changed", "strict") in reasons
    # Drills do not make a node nondeterministic; nor does an environment change.
    assert not {node for node, *_ in reasons} & {"drilled", "upgraded"}
    # Outside the window nothing is counted.
    assert "old" not in {node for node, *_ in reasons}
    assert report["summary"]["nondeterministic"] == 2


def test_drift_names_the_attribute_that_changed(fleet):
    report = get_audit(fleet).json()
    (drift,) = report["drift"]
    assert drift["node"] == "upgraded"
    assert {"attribute": "env_vars.MKL_CBWR", "before": "unset", "after": "COMPATIBLE"} \
        in drift["attributes"]
    assert {(c["workload"], c["variant"]) for c in drift["outputs_changed"]} == \
        {("cnn", "default"), ("cnn", "strict")}


def test_policy_inventory_and_broken_inputs(fleet):
    report = get_audit(fleet).json()
    assert {(row["node"], row["attribute"], row["value"]) for row in report["policy"]} == \
        {("flaky", "env_vars.MKL_CBWR", "COMPATIBLE"),
         ("upgraded", "env_vars.MKL_CBWR", "COMPATIBLE")}
    assert report["inventory"]["torch"] == [{"value": "2.13.0", "nodes": 9}]
    assert report["summary"]["nodes"] == 9 and report["summary"]["environments"] == 2
    broken = {(row["node"], row["variant"], tuple(row["differs"]))
              for row in report["broken_inputs"]}
    assert broken == {("broken", "default", ("input_hash",)),
                      ("broken", "strict", ("input_hash",))}


def test_cost_of_determinism_per_environment(fleet):
    report = get_audit(fleet).json()
    costs = report["determinism_cost"]
    assert len(costs) == 2
    assert all(row["ratio"] == pytest.approx(1.5) for row in costs)
    assert sum(row["nodes"] for row in costs) == 9


def test_stale_nodes(fleet):
    # Every upload of the fixture arrived before `now` and (however slow the machine)
    # well within the hour before it.
    now = datetime.now(timezone.utc)
    engine = get_engine(fleet.settings)
    with session_factory(engine)() as session:
        fresh = service.audit(session=session, policy=Policy(stale_after_hours=1), now=now)
        later = service.audit(session=session, policy=Policy(stale_after_hours=1),
                              now=now + timedelta(hours=3))
    assert fresh.stale == []
    assert len(later.stale) == 9 and later.stale[0].hours_since >= 2.9
    assert later.summary.stale == 9


def test_a_stale_nodes_last_run_is_its_newest_whatever_the_upload_order(api):
    # The newer run, sent first by a spool, ran default alone: the older, uploaded last,
    # still holds the node's latest strict results.
    newer = run_document("sleeper", started_at=at(2), variants=("default",))
    older = document("sleeper", 5)
    assert api.post_run(newer).status_code == 201
    assert api.post_run(older).status_code == 201
    engine = get_engine(api.settings)
    with session_factory(engine)() as session:
        report = service.audit(session=session, policy=Policy(stale_after_hours=1),
                               now=datetime.now(timezone.utc) + timedelta(hours=3))
    assert [(row.node, row.last_run_id) for row in report.stale] == [
        ("sleeper", newer["run_id"])]


@pytest.mark.parametrize("policy, hours_later", [
    (Policy(window_days=7), 0),  # the fixture's policy: suspect, watch, nondeterministic
    (Policy(window_days=7, stale_after_hours=1), 3),  # every node stale too
    (Policy(window_days=7), 24 * 8),  # the window has passed every disagreement
    (Policy(window_days=7, min_peers=10), 0),  # no quorum: nobody judged
])
def test_the_summary_alone_counts_what_the_whole_audit_counts(fleet, policy, hours_later):
    now = datetime.now(timezone.utc) + timedelta(hours=hours_later)
    with session_factory(get_engine(fleet.settings))() as session:
        whole = service.audit(session=session, policy=policy, now=now).summary
        alone = service.audit_summary(session=session, policy=policy, now=now)
    assert alone.model_dump().items() <= whole.model_dump().items()
    assert set(alone.model_dump()) == {"nodes", "environments", *STATUSES, "devices",
                                       "suspect_devices", "watched_devices"}


def test_the_openapi_schema_names_every_row(fleet):
    schemas = fleet.client.get("/openapi.json").json()["components"]["schemas"]
    audit = schemas["AuditOut"]
    assert audit.get("additionalProperties") is False
    assert audit["properties"]["suspects"]["items"] == {"$ref": "#/components/schemas/SuspectRow"}
    assert {"SuspectRow", "StaleRow", "PolicyRow", "BrokenInputsRow", "DriftRow",
            "InventoryRow", "DeterminismCostRow", "RepeatsDisagreeRow", "StrictChangedRow",
            "AuditSummary"} <= set(schemas)


def test_csv_tables(fleet):
    findings = list(csv.DictReader(io.StringIO(get_audit(fleet, format="csv").text)))
    assert {"node": "drilled", "finding": "suspect (drill)"}.items() <= findings[0].items()
    assert {(row["node"], row["finding"]) for row in findings} >= {
        ("glitchy", "watch"), ("flaky", "nondeterministic"), ("upgraded", "drift"),
        ("broken", "broken_inputs"), ("flaky", "policy")}
    response = get_audit(fleet, format="csv", table="suspects")
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [(row["node"], row["status"]) for row in rows] == [("drilled", "suspect"),
                                                               ("glitchy", "watch")]


def test_unknown_csv_table_is_400_listing_the_tables(fleet):
    response = fleet.client.get("/api/v1/audit", params={"format": "csv", "table": "nope"},
                                headers=fleet.reader)
    assert response.status_code == 400
    assert "'nope'" in response.text and "suspects" in response.text


def test_audit_needs_a_reader(fleet):
    assert fleet.client.get("/api/v1/audit").status_code == 401
    assert fleet.client.get("/api/v1/audit", headers=fleet.agent).status_code == 403


def test_audit_of_an_empty_server(api):
    report = get_audit(api).json()
    assert report["summary"]["nodes"] == 0
    assert report["suspects"] == [] and report["drift"] == [] and report["stale"] == []


def test_drift_is_found_whatever_order_the_runs_arrive_in(api):
    # A spool sends the newer run first: the change is still found, in started_at order.
    assert api.post_run(document("late", 2, env_vars={"MKL_CBWR": "COMPATIBLE"},
                                 shift=2e-3)).status_code == 201
    assert api.post_run(document("late", 5)).status_code == 201
    (drift,) = get_audit(api).json()["drift"]
    assert drift["node"] == "late"
    assert drift["attributes"] == [
        {"attribute": "env_vars.MKL_CBWR", "before": "unset", "after": "COMPATIBLE"}]
    assert drift["outputs_changed"]


def test_the_current_environment_is_the_newest_runs(make_api, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[allowed]\n"env_vars.MKL_CBWR" = ["unset"]\n')
    api = make_api(policy_file=policy)
    assert api.post_run(document("mover", 2, env_vars={"MKL_CBWR": "COMPATIBLE"})
                        ).status_code == 201
    assert api.post_run(document("mover", 5)).status_code == 201  # older, arrives later
    report = get_audit(api).json()
    # Judged on the newest run's environment (MKL), not on the last upload's.
    assert [(row["node"], row["value"]) for row in report["policy"]] == [
        ("mover", "COMPATIBLE")]
    assert report["summary"]["environments"] == 1
    assert report["inventory"]["torch"] == [{"value": "2.13.0", "nodes": 1}]



FORMULA = '=HYPERLINK("http://x","y")'


@pytest.mark.parametrize("path", ["/api/v1/audit?format=csv&table={table}",
                                  "/audit.csv?table={table}"])
def test_csv_cells_that_a_spreadsheet_would_run_as_formulas_start_with_a_quote(fleet, path):
    """OWASP's rule: a text cell starting with = + - @, a tab or a CR gets a leading '.
    Numbers the server computed stay numbers."""
    mkl = {"MKL_CBWR": "+SUM(1,2)"}  # the policy wants it unset: a violation naming the value
    uploads = [document(FORMULA, 2, env_vars=mkl, repeats_agree=False),
               document("@flaky", 2, repeats_agree=False),
               document("-flaky", 2, repeats_agree=False)]
    for upload in uploads:
        assert fleet.post_run(upload).status_code == 201
    # A name starting with a tab or CR never gets stored (invisible characters, issue 29).
    for name in ("\tflaky", "\rflaky"):
        assert fleet.post_run(document(name, 2, repeats_agree=False)).status_code == 422

    def table(name):
        response = fleet.client.get(path.format(table=name), headers=fleet.reader)
        assert response.status_code == 200, response.text
        return list(csv.DictReader(io.StringIO(response.text, newline="")))

    escaped = {"'" + FORMULA, "'@flaky", "'-flaky"}
    assert {row["node"] for row in table("nondeterministic")} >= escaped
    assert {row["node"] for row in table("findings")} >= escaped
    assert [row["value"] for row in table("policy") if row["node"] == "'" + FORMULA] == [
        "'+SUM(1,2)"]
    for name in ("findings", "nondeterministic", "policy"):
        for row in table(name):
            for cell in row.values():
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (name, row)
    # Numbers the server computed are written as numbers.
    cost = table("determinism_cost")
    assert cost and all(float(row["ratio_estimate"]) > 0 and int(row["nodes"]) > 0
                        for row in cost)
    # A lone node's one timed run: its ratio is not shown, and the note says why.
    assert any(row["ratio"] == "" and "one timed run" in row["note"] for row in cost)


PAGED = ("stale", "policy", "suspects", "nondeterministic", "broken_inputs", "drift")


def test_each_list_is_a_page_with_its_total(fleet):
    """Pages of one row, in turn, are the whole list (every row, as the CSV has them),
    each row naming the same runs; the summary counts every node whatever the page."""
    from numparity_server.kit.policy_file import load_policy

    with session_factory(get_engine(fleet.settings))() as session:
        whole = service.audit(session=session, policy=load_policy(
            fleet.settings.policy_file)).model_dump(mode="json")
    assert any(len(whole[table]) > 1 for table in PAGED)
    first = get_audit(fleet).json()
    assert first["limit"] == fleet.settings.page_default and first["offset"] == 0
    longest = max(len(whole[table]) for table in PAGED)
    pages = [get_audit(fleet, limit=1, offset=offset).json() for offset in range(longest + 1)]
    for table in PAGED:
        assert [row for page in pages for row in page[table]] == whole[table], table
        assert {page["totals"][table] for page in pages} == {len(whole[table])}
        assert all(len(page[table]) <= 1 for page in pages)
    assert all(page["summary"] == whole["summary"] for page in pages)
    too_many = fleet.client.get("/api/v1/audit", headers=fleet.reader,
                                params={"limit": fleet.settings.page_max + 1})
    assert too_many.status_code == 422 and "limit" in too_many.text
