"""The dashboard's pages, read the way a browser gets them (HTML over HTTP): the heatmap
agrees with /compare, the token prompt, the pages' 404 and 422, and the chart data.
The same pages in a real Chromium: tests/browser."""

from __future__ import annotations

import json
import re
from html import unescape
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from helpers.documents import run_document

from numparity_server.auth import service as auth_service
from numparity_server.kit.db import get_engine, session_factory


class Cells(HTMLParser):
    """The heatmap's node rows: {node: {"workload/variant": (verdict, href, link class)}}."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.columns: list[str] = []
        self.rows: dict[str, dict[str, tuple[str, str | None, str | None]]] = {}
        self._node: str | None = None
        self._cell: list[str | None] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "th" and "data-key" in a:
            self.columns.append(a["data-key"] or "")
        elif tag == "tr" and "data-node" in a:
            self._node = a["data-node"]
            self.rows[self._node or ""] = {}
        elif tag == "tr":  # a device's row under its node's: not the node's cells
            self._node = None
        elif tag == "td" and a.get("class") == "cell" and self._node is not None:
            self._cell = [a.get("data-verdict"), None, None]
        elif tag == "a" and self._cell is not None:
            self._cell[1], self._cell[2] = a.get("href"), a.get("class")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._node is not None:
            row = self.rows[self._node]
            row[self.columns[len(row)]] = tuple(self._cell)  # type: ignore[assignment]
            self._cell = None


def upload(api, *documents):
    for document in documents:
        response = api.post_run(document)
        assert response.status_code == 201, response.text


def page(api, path, status=200):
    response = api.client.get(path, headers=api.reader)
    assert response.status_code == status, response.text[:2000]
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def errors_of(html):
    return [unescape(m) for m in re.findall(r'<p class="error">(.*?)</p>', html, re.S)]


def chart_data(html, element_id):
    match = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>',
                      html, re.S)
    assert match, f"no chart data {element_id}"
    return json.loads(match.group(1))


@pytest.fixture
def split_fleet(api):
    """Three stock nodes, one far off (divergent), one within tolerance (equivalent), one
    with an extra workload the others lack."""
    upload(api,
           run_document("node-1", run_id="r1"), run_document("node-2", run_id="r2"),
           run_document("node-3", run_id="r3"),
           run_document("far", run_id="rf", shift=1e-3, env_vars={"MKL_CBWR": "COMPATIBLE"}),
           run_document("near", run_id="rn", shift=1e-6, env_vars={"OMP_NUM_THREADS": "1"}),
           run_document("extra", run_id="rx", workloads=("cnn", "mlp")))
    return api


def test_heatmap_colours_each_cell_by_its_verdict_against_the_most_common_answer(split_fleet):
    api = split_fleet
    heat = Cells(page(api, "/"))
    assert set(heat.rows) == {"node-1", "node-2", "node-3", "far", "near", "extra"}
    # tf32 was skipped everywhere (a CPU fleet): no column of skipped cells (issue 43).
    assert heat.columns == ["cnn/default", "mlp/default"]
    verdicts = {node: {key: cell[0] for key, cell in row.items()}
                for node, row in heat.rows.items()}
    assert {node: row["cnn/default"] for node, row in verdicts.items()} == {
        "node-1": "identical", "node-2": "identical", "node-3": "identical",
        "extra": "identical", "far": "divergent", "near": "equivalent"}
    # Only "extra" ran mlp.
    assert verdicts["extra"]["mlp/default"] == "identical"
    assert verdicts["node-1"]["mlp/default"] == "missing"

    # The baseline (first node of the largest answer) links to its node page, the others
    # to the comparison of their run against the baseline's run.
    # ("extra" comes first by name among the four that agree).
    assert heat.rows["extra"]["cnn/default"][1:] == ("/nodes/extra", "node-link")
    verdict, href, kind = heat.rows["node-1"]["cnn/default"]
    assert (verdict, kind) == ("identical", "cell-link")
    assert parse_qs(urlsplit(href).query)["run_a"] == ["rx"]
    for node, run_id in (("far", "rf"), ("near", "rn")):
        href = heat.rows[node]["cnn/default"][1]
        query = parse_qs(urlsplit(href).query)
        assert query == {"run_a": ["rx"], "run_b": [run_id], "workload": ["cnn"],
                         "variant": ["default"]}
        # The cell says what the comparison says, on the page and in the API.
        api_report = api.client.get("/api/v1/compare", params={k: v[0] for k, v in query.items()},
                                    headers=api.reader).json()
        (pair,) = api_report["pairs"]
        assert pair["summary"]["result_verdict"]["verdict"] == heat.rows[node]["cnn/default"][0]
        compared = page(api, href)
        assert f'data-verdict="{pair["summary"]["output_verdict"]}"' in compared
        decided = pair["summary"]["result_verdict"]
        assert (f'class="verdict result-verdict" data-verdict="{decided["verdict"]}"'
                in compared)
        if decided["verdict"] != "identical":
            assert f'decided by <code>{decided["tensor"]}</code>' in compared
        assert "NaN against NaN counts as equal" in compared


def test_the_comparison_page_charts_each_layers_error_and_marks_the_first_divergent_one(
        split_fleet):
    api = split_fleet
    html = page(api, "/compare?run_a=r1&run_b=rf&workload=cnn&variant=default")
    assert '<div id="layer-chart"' in html
    assert re.search(r'<span id="first-divergent"[^>]*>conv2</span>', html)
    chart = chart_data(html, "layers-1")
    assert chart["names"] == ["conv1", "conv2", "fc1"]  # the layers, in execution order
    assert chart["first_divergent"] == "conv2" and chart["first_index"] == 1
    assert chart["errors"][0] is None and chart["identical"] == ["conv1"]
    # The oracle: relative L2 error recomputed in float64 from the uploaded bytes.
    reference, candidate = run_document(), run_document(shift=1e-3)
    for index, name in ((1, "conv2"), (2, "fc1")):
        a, b = (_values(doc, name) for doc in (reference, candidate))
        assert chart["errors"][index] == pytest.approx(
            np.linalg.norm(b - a) / np.linalg.norm(a), rel=1e-9)
    # Every tensor is in the table, readable without JavaScript.
    for name in ("conv1", "conv2", "fc1", "output"):
        assert f"<code>{name}</code>" in html
    assert "env_vars.MKL_CBWR" in html


def _values(document, name):
    import base64

    (result,) = [r for r in document["results"]
                 if r["status"] == "ok" and r["workload"] == "cnn"]
    (tensor,) = [t for t in result["tensors"] if t["name"] == name]
    return np.frombuffer(base64.b64decode(tensor["values"]["data"]), "<f4").astype(np.float64)


def test_the_workload_page_shows_groups_nodes_and_attribution(split_fleet):
    api = split_fleet
    html = page(api, "/workloads/cnn")
    assert re.search(r'<section class="variant" id="variant-default" data-variant="default">',
                     html)
    report = api.client.get("/api/v1/divergence", params={"workload": "cnn",
                                                          "variant": "default"},
                            headers=api.reader).json()
    section = html.split('data-variant="default"')[1].split("</section>")[0]
    assert len(re.findall(r"<tr data-group=", section)) == len(report["groups"]) == 3
    for group in report["groups"]:
        for node in group["nodes"]:
            assert f'<a href="/nodes/{node}">{node}</a>' in section
    assert '<table class="attribution sortable">' in section
    assert "env_vars.MKL_CBWR" in section
    # The skipped variant says why there is nothing to group.
    skipped = html.split('data-variant="tf32"')[1].split("</section>")[0]
    assert "no ok results" in unescape(skipped)


def test_the_node_page_puts_environment_and_answer_changes_on_one_timeline(api):
    upload(api,
           run_document("node-1", run_id="before", started_at="2026-11-20T10:00:00Z"),
           run_document("node-1", run_id="after", started_at="2026-11-21T10:00:00Z",
                        env_vars={"MKL_CBWR": "COMPATIBLE"}, shift=1e-3),
           run_document("node-1", run_id="again", started_at="2026-11-22T10:00:00Z",
                        env_vars={"MKL_CBWR": "COMPATIBLE"}, shift=1e-3))
    html = page(api, "/nodes/node-1")
    chart = chart_data(html, "timeline-data")
    assert chart["t"] == [1795168800.0, 1795255200.0, 1795341600.0]  # oldest first
    assert chart["environment"] == [None, 1, None]
    assert chart["outputs"] == [None, 2, None]
    assert "MKL_CBWR: unset → COMPATIBLE" in chart["labels"][1]["environment"]
    assert chart["labels"][1]["outputs"] == "cnn/default"
    assert '<div id="timeline-chart"' in html
    rows = re.findall(r'<tr data-run="([^"]+)">', html)
    assert rows == ["again", "after", "before"]
    assert "<code>env_vars.MKL_CBWR</code>: unset → COMPATIBLE" in html
    assert 'href="/compare?run_a=before&amp;run_b=after"' in html


def test_the_audit_page_shows_what_the_audit_says(fleet):
    api = fleet
    html = page(api, "/audit")
    report = api.client.get("/api/v1/audit", headers=api.reader).json()
    for table, key in (("suspects", "suspects"), ("nondeterministic", "nondeterministic"),
                       ("stale", "stale"), ("policy", "policy")):
        body = html.split(f'<table id="{table}"')[1].split("</table>")[0]
        assert sorted(set(re.findall(r'<tr data-node="([^"]+)"', body))) == sorted(
            {row["node"] for row in report[key]}), table
    suspects = html.split('<table id="suspects"')[1].split("</table>")[0]
    assert 'data-node="drilled"' in suspects and ">drill<" in suspects
    for status in ("ok", "suspect", "watch", "nondeterministic", "stale"):
        assert f'<li data-status="{status}"><b>{report["summary"][status]}</b>' in html
    response = api.client.get("/audit.csv", params={"table": "suspects"}, headers=api.reader)
    assert response.status_code == 200 and response.text.startswith("node,")
    assert "drilled" in response.text
    unknown = api.client.get("/audit.csv", params={"table": "bogus"}, headers=api.reader)
    assert unknown.status_code == 400 and "text/html" in unknown.headers["content-type"]
    assert "unknown table &#39;bogus&#39;; tables: findings, inventory" in unknown.text


def test_pages_ask_for_a_reader_token_once_and_keep_it_in_a_cookie(split_fleet):
    api = split_fleet
    client = api.client
    client.headers["Origin"] = "http://testserver"  # as a browser posts a form
    reader = api.reader["Authorization"].split()[1]
    agent = api.agent["Authorization"].split()[1]

    asked = client.get("/nodes/far?limit=5", follow_redirects=False)
    assert asked.status_code == 303
    assert asked.headers["location"] == "/login?next=%2Fnodes%2Ffar%3Flimit%3D5"
    prompt = client.get(asked.headers["location"])
    assert prompt.status_code == 200 and 'id="token-form"' in prompt.text
    assert 'name="next" value="/nodes/far?limit=5"' in prompt.text

    wrong = client.post("/login", data={"token": "nope", "next": "/"})
    assert wrong.status_code == 401 and errors_of(wrong.text) == ["Not accepted: unknown token."]
    not_reader = client.post("/login", data={"token": agent, "next": "/"})
    assert not_reader.status_code == 401
    assert "needs the reader role" in errors_of(not_reader.text)[0]
    assert "numparity_token" not in client.cookies

    done = client.post("/login", data={"token": reader, "next": "/nodes/far?limit=5"},
                       follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/nodes/far?limit=5"
    cookie = done.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert client.get("/nodes/far").status_code == 200
    assert client.get("/").status_code == 200
    # The API itself still wants a bearer token: the cookie opens pages only.
    assert client.get("/api/v1/nodes").status_code == 401

    # A revoked token brings the prompt back.
    with session_factory(get_engine(api.settings))() as session:
        (row,) = [t for t in auth_service.list_tokens(session=session) if t.role == "reader"]
        auth_service.revoke_token(session=session, token_id=row.id)
        session.commit()
    again = client.get("/")
    assert again.url.path == "/login" and 'id="token-form"' in again.text
    assert errors_of(again.text) == ["That token has been revoked."]
    assert "numparity_token" not in client.cookies  # the dead cookie is dropped

    # Sign out forgets the cookie; a login never redirects off the server.
    done = client.post("/login", data={"token": _new_reader(api), "next": "/"})
    assert done.url.path == "/" and "numparity_token" in client.cookies
    client.post("/logout")
    assert "numparity_token" not in client.cookies
    assert client.get("/").url.path == "/login"
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        assert _local_target(client, api, target) == "/"


def _new_reader(api):
    with session_factory(get_engine(api.settings))() as session:
        token = auth_service.create_token(session=session, role="reader", label="t").token
        session.commit()
    return token


def _local_target(client, api, target):
    response = client.post("/login", data={"token": _new_reader(api), "next": target},
                           follow_redirects=False)
    return response.headers["location"]


def _sign_in(client, token, **headers):
    return client.post("/login", data={"token": token, "next": "/"}, headers=headers,
                       follow_redirects=False)


def test_sign_in_and_sign_out_refuse_cross_site_posts(api):
    """A form another site posts (login CSRF, or signing a user out) is refused with a
    403 page saying why: Origin (else Referer) must be this server."""
    client = api.client
    for headers, named in (({"Origin": "http://evil.example"}, "http://evil.example"),
                           ({"Origin": "http://testserver:8080"}, "http://testserver:8080"),
                           ({"Origin": "null"}, "null"),
                           ({"Referer": "https://evil.example/page"}, "https://evil.example"),
                           ({"Origin": "http://evil.example",
                             "Referer": "http://testserver/login"}, "http://evil.example")):
        refused = _sign_in(client, _new_reader(api), **headers)
        assert refused.status_code == 403, headers
        assert refused.headers["content-type"].startswith("text/html")
        assert "set-cookie" not in refused.headers
        (message,) = errors_of(refused.text)
        assert f"sent from {named}" in message and "testserver" in message, message
    unnamed = _sign_in(client, _new_reader(api))
    assert unnamed.status_code == 403 and "set-cookie" not in unnamed.headers
    assert "neither Origin nor Referer" in errors_of(unnamed.text)[0]

    # The server's own form: Origin, or only a Referer (an older browser).
    for headers in ({"Origin": "http://testserver"},
                    {"Referer": "http://testserver/login?next=/"},
                    {"Origin": "HTTP://TestServer:80"}):
        signed_in = _sign_in(client, _new_reader(api), **headers)
        assert signed_in.status_code == 303, (headers, signed_in.text[:500])
        assert "numparity_token" in client.cookies

    # Signing out from another site leaves the cookie; from this one it goes.
    out = client.post("/logout", headers={"Origin": "http://evil.example"},
                      follow_redirects=False)
    assert out.status_code == 403 and "numparity_token" in client.cookies
    assert client.get("/", follow_redirects=False).status_code == 200
    out = client.post("/logout", headers={"Origin": "http://testserver"},
                      follow_redirects=False)
    assert out.status_code == 303 and "numparity_token" not in client.cookies


def test_behind_a_proxy_the_public_url_is_this_server(make_api):
    """A proxy that rewrites Host: NUMPARITY_PUBLIC_URL names the origin browsers use."""
    api = make_api(public_url="https://numparity.lab.example/")
    assert _sign_in(api.client, _new_reader(api),
                    Origin="https://numparity.lab.example").status_code == 303
    assert _sign_in(api.client, _new_reader(api),
                    Referer="https://numparity.lab.example/login").status_code == 303
    assert _sign_in(api.client, _new_reader(api),
                    Origin="http://numparity.lab.example").status_code == 403
    assert _sign_in(api.client, _new_reader(api), Origin="http://testserver").status_code == 303


def test_open_reads_need_no_token(make_api):
    api = make_api(open_reads=True)
    upload(api, run_document("node-1"))
    response = api.client.get("/")
    assert response.status_code == 200 and 'data-node="node-1"' in response.text


def test_unknown_things_are_404_pages_that_name_them(split_fleet):
    api = split_fleet
    assert errors_of(page(api, "/nodes/ghost", 404)) == ["no node named 'ghost'"]
    assert errors_of(page(api, "/workloads/ghost", 404)) == [
        "no node has results of workload 'ghost' in suite 'standard'"]
    assert errors_of(page(api, "/compare?run_a=r1&run_b=ghost", 404)) == [
        "no run with run_id 'ghost'"]
    assert errors_of(page(api, "/no/such/page", 404)) == ["there is no page at /no/such/page"]
    for html in (page(api, "/nodes/ghost", 404),):
        assert "<h1>Not found</h1>" in html and "Traceback" not in html
    # The API's errors stay JSON.
    response = api.client.get("/api/v1/nodes/ghost", headers=api.reader)
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_query_parameters_of_the_wrong_type_are_422_with_a_readable_message(split_fleet):
    api = split_fleet
    assert errors_of(page(api, "/nodes/far?limit=abc", 422)) == [
        "limit: Input should be a valid integer, unable to parse string as an integer "
        "(got 'abc')"]
    assert errors_of(page(api, "/compare?run_a=r1", 422)) == ["run_b: Field required"]
    response = api.client.get("/api/v1/nodes", params={"limit": "abc"}, headers=api.reader)
    assert response.status_code == 422 and response.json()["error"] == "validation_error"


def test_an_empty_server_says_how_to_start(api):
    assert "No results yet" in page(api, "/")


def test_the_chart_library_is_served_from_the_package(api):
    for path in ("/static/vendor/uPlot.iife.min.js", "/static/vendor/uPlot.min.css",
                 "/static/dashboard.js", "/static/dashboard.css"):
        response = api.client.get(path)
        assert response.status_code == 200 and len(response.content) > 1000, path
    html = page(api, "/")
    assert "cdn" not in html.lower() and "https://" not in html


def test_a_page_of_the_heatmap_is_judged_against_the_whole_fleet(split_fleet):
    api = split_fleet
    # Nodes by name: extra, far, near, node-1, node-2, node-3; the baseline "extra" is
    # not on the second page, its answer still decides.
    html = page(api, "/?limit=2&offset=2")
    heat = Cells(html)
    assert list(heat.rows) == ["near", "node-1"]
    assert heat.rows["near"]["cnn/default"][0] == "equivalent"
    assert heat.rows["node-1"]["cnn/default"][0] == "identical"
    assert parse_qs(urlsplit(heat.rows["near"]["cnn/default"][1]).query)["run_a"] == ["rx"]
    assert "nodes 3–4 on this page" in html
    assert 'offset=0">previous nodes</a>' in html and 'offset=4">next nodes</a>' in html


def test_a_large_group_lists_its_first_nodes_and_counts_the_rest(api, monkeypatch):
    from numparity_server.dashboard import api as pages

    monkeypatch.setattr(pages, "MAX_GROUP_NODES", 2)
    upload(api, *(run_document(f"node-{i}") for i in range(4)))
    section = page(api, "/workloads/cnn").split('data-variant="default"')[1]
    assert re.findall(r'<a href="/nodes/([^"]+)">', section.split("</tr>")[1]) == [
        "node-0", "node-1"]
    assert "and 2 more" in section
