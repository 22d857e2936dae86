"""The audit's data pipeline table (design §3.3.12, §3.4): what a lab reads in /audit, on
the audit page and in its CSV, from uploaded `data` checks."""

from __future__ import annotations

import csv
import io

from bs4 import BeautifulSoup
from helpers.documents import run_document

JITTER = {"augmentation": "jitter", "workers": [0, 1], "num_workers": 2}


def check(equal: bool, op: str | None = None, **details) -> dict:
    return {"equal": equal, "max_ulp": None, "max_rel": None, "op": op, **details}


CHECKS = {
    "recipe_order_reproducible": check(True, num_workers=[]),
    "recipe_runs_agree": check(True, num_workers=[], augmentations=[]),
    "recipe_workers_agree": check(False, "crop", num_workers=[0, 2],
                                  differing={"2": ["crop", "noise"]}, order_equal=True),
    "recipe_streams_distinct": check(True, duplicates=[], random=["crop", "jitter"]),
    "no_recipe_order_reproducible": check(False, "order", num_workers=[0, 2]),
    "no_recipe_runs_agree": check(False, "crop", num_workers=[0, 2],
                                  augmentations=["crop", "jitter"]),
    "no_recipe_workers_agree": check(False, "crop", num_workers=[0, 2],
                                     differing={"2": ["crop"]}),
    "no_recipe_streams_distinct": check(False, "jitter", duplicates=[JITTER],
                                        random=["crop", "jitter"]),
}


def data_run(node: str, checks: dict = CHECKS) -> dict:
    document = run_document(node, workloads=("data",), variants=("default",))
    document["results"][0]["checks"] = checks
    return document


def test_the_audit_names_what_breaks_without_the_recipe(api):
    for node in ("node-1", "node-2"):
        assert api.post_run(data_run(node)).status_code == 201
    report = api.client.get("/api/v1/audit", headers=api.reader).json()
    (row,) = report["data_pipeline"]
    assert {k: row[k] for k in ("workload", "variant", "devices", "recipe_holds", "without",
                                "without_holds", "needs_recipe", "workers_agree")} == {
        "workload": "data", "variant": "default", "devices": 2, "recipe_holds": True,
        "without": "no_recipe", "without_holds": False, "needs_recipe": True,
        "workers_agree": False}
    assert row["recipe_broken"] == []
    assert row["without_broken"] == [
        "the order changes between runs (num_workers 0, 2)",
        "the batches change between runs (num_workers 0, 2): crop, jitter",
        "jitter repeats in workers 0, 1 (num_workers=2)"]
    (streams,) = [b for b in row["breaks"] if b["check"] == "streams_distinct"]
    assert streams["duplicates"] == [JITTER] and streams["devices"] == 2
    # The pipeline's checks are not the numerics table's.
    assert report["numerics"] == []

    html = api.client.get("/audit", headers=api.reader).text
    (tr,) = BeautifulSoup(html, "html.parser").select("#data-pipeline tbody tr")
    cells = {td["data-check"]: td for td in tr.select("td[data-check]")}
    assert {name: td["data-holds"] for name, td in cells.items()} == {
        "recipe": "yes", "no_recipe": "no", "workers_agree": "no"}
    assert "jitter repeats in workers 0, 1 (num_workers=2)" in cells["no_recipe"].get_text()
    assert "crop, noise" in cells["workers_agree"].get_text()

    text = api.client.get("/api/v1/audit", params={"format": "csv", "table": "data_pipeline"},
                          headers=api.reader).text
    (line,) = list(csv.DictReader(io.StringIO(text)))
    assert line["needs_recipe"] == "True" and line["without"] == "no_recipe"
    assert "jitter repeats in workers 0, 1" in line["without_broken"]


def test_a_node_whose_recipe_breaks_is_its_environments_row(api):
    broken = {**CHECKS, "recipe_runs_agree": check(False, "jitter", num_workers=[2],
                                                   augmentations=["jitter"])}
    api.post_run(data_run("node-1"))
    other = data_run("odd", broken)
    other["environment"] = run_document("odd", env_vars={"OMP_NUM_THREADS": "1"})["environment"]
    api.post_run(other)
    rows = api.client.get("/api/v1/audit", headers=api.reader).json()["data_pipeline"]
    by_holds = {row["recipe_holds"]: row for row in rows}
    assert set(by_holds) == {True, False}
    assert by_holds[False]["recipe_broken"] == [
        "the batches change between runs (num_workers 2): jitter"]
    assert by_holds[False]["needs_recipe"] is False
    html = api.client.get("/audit", headers=api.reader).text
    recipe_cells = [td.get_text(" ", strip=True) for td in BeautifulSoup(
        html, "html.parser").select('#data-pipeline td[data-check="recipe"]')]
    assert sorted(recipe_cells) == [
        "no the batches change between runs (num_workers 2): jitter", "yes"]


def test_a_policy_can_require_the_pipeline_checks(make_api, tmp_path):
    """A lab that requires its pipelines' workers to draw distinct streams: every node
    whose latest result says otherwise, and where it breaks."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[required]\n"data.no_recipe_streams_distinct" = true\n'
                      '"data.recipe_runs_agree" = true\n'
                      '"mylab.data:loader.own_runs_agree" = true\n')
    api = make_api(policy_file=policy)
    api.post_run(data_run("node-1"))
    lab = run_document("node-1", workloads=("mylab.data:loader",), variants=("default",))
    lab["results"][0]["checks"] = {"own_runs_agree": check(False, "offset", num_workers=[2],
                                                           augmentations=["offset"])}
    api.post_run(lab)
    rows = api.client.get("/api/v1/audit", headers=api.reader).json()["policy"]
    assert sorted((row["node"], row["attribute"], row["value"]) for row in rows) == [
        ("node-1", "data.no_recipe_streams_distinct", "false under default (at jitter)"),
        ("node-1", "mylab.data:loader.own_runs_agree", "false under default (at offset)")]
