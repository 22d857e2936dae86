"""The audit page's numerics table and cost of determinism (design §3.4, §3.3.12): what a
lab reads there, from uploaded checks and timings."""

from __future__ import annotations

from bs4 import BeautifulSoup
from helpers.documents import run_document

HOLDS = {"equal": True, "max_ulp": 0, "max_rel": 0.0}
DECODER = {"decode_equals_prefill": {"equal": False, "max_ulp": 40, "max_rel": 1e-4},
           "batch_invariant": {"equal": False, "max_ulp": 7, "max_rel": 1e-6,
                               "op": "blocks.0.attn.qkv"},
           "attention_backends_agree": {**HOLDS, "op": None, "default": "flash"}}


def decoder_run(node: str, checks: dict, *, wall_s: float, variant: str = "default",
                spread: float | None = None) -> dict:
    document = run_document(node, workloads=("decoder",), variants=(variant,))
    result = document["results"][0]
    result.update(checks=checks, wall_s=wall_s)
    if spread is not None:
        result["wall_s_spread"] = spread
    return document


def test_the_audit_page_shows_each_check_and_the_op_that_breaks_it(api):
    for node in ("node-1", "node-2"):
        assert api.post_run(decoder_run(node, DECODER, wall_s=1.0)).status_code == 201
    html = api.client.get("/audit", headers=api.reader).text
    (row,) = BeautifulSoup(html, "html.parser").select("#numerics tbody tr")
    cells = {td["data-check"]: td for td in row.select("td[data-check]")}
    assert {name: td["data-holds"] for name, td in cells.items()} == {
        "batch_invariant": "no", "decode_equals_prefill": "no",
        "attention_backends_agree": "yes"}
    assert " ".join(cells["batch_invariant"].get_text(" ").split()) == \
        "no at decoder: blocks.0.attn.qkv"
    assert row.select("td")[4].get_text() == "2"  # devices


def test_the_cost_of_determinism_is_shown_only_with_an_uncertainty_below_the_effect(api):
    # Two nodes that time strict at twice default, each with a small spread: shown.
    for node in ("steady-1", "steady-2"):
        for variant, seconds in (("default", 1.0), ("strict", 2.0)):
            api.post_run(decoder_run(node, DECODER, wall_s=seconds, variant=variant,
                                     spread=0.01))
    # One node elsewhere with one timed run each: not shown, and the page says why.
    for variant, seconds in (("default", 3.0), ("strict", 1.0)):
        api.post_run(decoder_run("lone", DECODER, wall_s=seconds, variant=variant)
                     | {"environment": run_document("lone", env_vars={"X": "1"})
                        ["environment"]})
    html = api.client.get("/audit", headers=api.reader).text
    rows = BeautifulSoup(html, "html.parser").select("#determinism-cost tbody tr")
    costs = [" ".join(row.select_one("td.cost").get_text(" ").split()) for row in rows]
    assert costs[0].startswith("2× ± 0.0"), costs
    assert costs[1].startswith("not measured") and "one timed run" in costs[1], costs
    assert "0.33" not in costs[1]  # one noisy run never reads as a figure
