"""The dashboard in a real browser, on the simulated fleet of ``numparity-server demo``.

What a user sees: the token prompt when reads are closed, the heatmap of the fleet's
nodes, a cell that leads to the comparison and its per-layer chart, the node timeline,
the audit, sortable tables, and readable 404/422 pages. Screenshots of every page land
in ``tests/browser/screenshots/`` (or ``$NUMPARITY_SCREENSHOTS``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from helpers.browser import (
    Dashboard,
    assert_no_console_errors,
    login,
    screenshot,
    wait_for_chart,
)

from numparity_server.demo import FLEET, VARIANTS, WORKLOADS

NODES = {node.name for node in FLEET}
COLUMNS = [f"{workload}/{variant}" for workload in WORKLOADS for variant in VARIANTS]
# The page contract's verdicts, and "broken" (other input or parameter bytes than the
# fleet's: a bug, not a divergence), which the dashboard shows too.
VERDICTS = {"identical", "equivalent", "divergent", "nonfinite", "broken", "failed",
            "skipped", "missing"}
STOCK_NODES = ("lab-01", "lab-02", "lab-03")
DRILL_NODE = next(node.name for node in FLEET if "--fault-drill" in node.args)
MKL_NODE = next(node.name for node in FLEET if "MKL_CBWR" in node.env)
THREAD_NODE = next(node.name for node in FLEET if "OMP_NUM_THREADS" in node.env)


def no_stack_trace(page: Any) -> None:
    body = page.locator("body").inner_text()
    assert "Traceback" not in body and 'File "' not in body, body[:2000]


def latest_run(api: httpx.Client, node: str) -> str:
    response = api.get(f"/nodes/{node}", params={"limit": 1})
    response.raise_for_status()
    return str(response.json()["runs"]["items"][0]["run_id"])


@pytest.fixture(scope="session")
def compare_path(api: httpx.Client) -> str:
    """lab-mkl's cnn against a stock node's: differs from fc1 on (the demo's report)."""
    return (f"/compare?run_a={latest_run(api, STOCK_NODES[0])}"
            f"&run_b={latest_run(api, MKL_NODE)}&workload=cnn&variant=default")


# The heatmap as {node: {"WORKLOAD/VARIANT": {"verdict", "href"}}}, cells in header order.
HEATMAP_JS = """() => {
  const table = document.querySelector('#heatmap');
  const keys = [...table.querySelectorAll('th[data-key]')].map(th => th.dataset.key);
  const rows = {};
  for (const tr of table.querySelectorAll('tbody tr[data-node]')) {
    const cells = [...tr.querySelectorAll('td.cell')].map(td => {
      const link = td.querySelector('a.cell-link');
      return {verdict: td.dataset.verdict, href: link ? link.getAttribute('href') : null};
    });
    rows[tr.dataset.node] = {cells, count: cells.length};
  }
  return {keys, rows};
}"""


def read_heatmap(page: Any) -> tuple[list[str], dict[str, dict[str, dict[str, Any]]]]:
    data = page.evaluate(HEATMAP_JS)
    keys = data["keys"]
    rows = {}
    for node, row in data["rows"].items():
        assert row["count"] == len(keys), f"{node}: {row['count']} cells for {len(keys)} columns"
        rows[node] = dict(zip(keys, row["cells"], strict=True))
    return keys, rows


# --- (a) the token prompt --------------------------------------------------------------


def test_token_prompt_then_cookie(anonymous_page: Any, dashboard: Dashboard) -> None:
    page = anonymous_page
    page.goto("/")
    assert page.locator("#heatmap").count() == 0, "the overview without a token"
    form = page.locator("form#token-form")
    assert form.is_visible()
    assert form.get_attribute("method").lower() == "post"
    assert form.get_attribute("action") == "/login"
    assert form.locator("input[name='token'][type='password']").count() == 1
    assert form.locator("input[type='hidden'][name='next']").count() == 1
    no_stack_trace(page)
    screenshot(page, "token-prompt")

    # A wrong token: the form again, saying so.
    login(page, "not-a-token")
    assert page.locator("form#token-form").is_visible()
    error = page.locator(".error").first
    assert error.is_visible() and error.inner_text().strip(), page.content()[:2000]
    no_stack_trace(page)
    screenshot(page, "token-prompt-wrong")

    # The reader token: the overview, and a cookie that later pages use.
    landed = login(page, dashboard.reader_token)
    assert landed is not None and landed.status == 200
    assert urlsplit(page.url).path == "/"
    assert page.locator("#heatmap").is_visible()
    cookies = page.context.cookies()
    assert any(c["name"] == "numparity_token" for c in cookies), cookies
    for path, selector in (("/audit", "#suspects"), ("/workloads/cnn", "section.variant"),
                           ("/nodes/lab-01", "#runs")):
        response = page.goto(path)
        assert response is not None and response.status == 200, path
        assert page.locator("form#token-form").count() == 0, path
        assert page.locator(selector).first.is_visible(), path
    assert_no_console_errors(page)


def test_token_prompt_returns_to_the_page_asked_for(anonymous_page: Any,
                                                    dashboard: Dashboard) -> None:
    page = anonymous_page
    page.goto("/workloads/cnn")
    assert page.locator("form#token-form input[name='next']").get_attribute("value") == (
        "/workloads/cnn")
    login(page, dashboard.reader_token)
    assert urlsplit(page.url).path == "/workloads/cnn"
    assert page.locator("section.variant").count() == len(
        {variant for node in FLEET for variant in node.variants})


def anonymous_paths(compare_path: str) -> tuple[str, ...]:
    return ("/", "/workloads/cnn", "/nodes/lab-01", compare_path, "/audit",
            "/nodes/no-such-node", "/workloads/nope", "/nodes/lab-01?limit=abc")


def test_every_page_without_a_token_is_the_prompt(anonymous_page: Any,
                                                  compare_path: str) -> None:
    page = anonymous_page
    for path in anonymous_paths(compare_path):
        page.goto(path)
        assert page.locator("form#token-form").is_visible(), path
        assert page.locator("form#token-form input[name='next']").get_attribute("value") == (
            path), path
        no_stack_trace(page)


def test_without_a_token_pages_redirect_to_the_form(dashboard: Dashboard,
                                                   compare_path: str) -> None:
    """A page without the cookie is not served: 303 to the sign-in form, which comes back
    to the page (the form is a page of its own, so the browser logs no failed request)."""
    with httpx.Client(base_url=dashboard.base_url, follow_redirects=False) as client:
        for path in anonymous_paths(compare_path):
            response = client.get(path)
            where = f"GET {path}: {response.status_code} {response.headers.get('location', '')}"
            assert response.status_code == 303, where
            assert response.headers["location"] == "/login?" + urlencode({"next": path}), where
            assert 'id="token-form"' in client.get(response.headers["location"]).text, where


# --- (b) the overview's heatmap --------------------------------------------------------


def test_heatmap_shows_the_fleet(page: Any) -> None:
    response = page.goto("/")
    assert response is not None and response.status == 200
    keys, rows = read_heatmap(page)
    assert set(rows) == NODES
    assert set(COLUMNS) <= set(keys), keys
    for node, cells in rows.items():
        for key, cell in cells.items():
            assert cell["verdict"] in VERDICTS, (node, key, cell)

    verdicts = [cell["verdict"] for cells in rows.values() for cell in cells.values()]
    assert any(v != "identical" for v in verdicts), "the demo fleet has real differences"
    # What the demo's report says: MKL's conditional mode changes cnn in both variants,
    # the drill flips a bit in strict only, one thread changes the long sum of probes,
    # and the stock nodes agree with each other everywhere.
    for variant in VARIANTS:
        assert rows[MKL_NODE][f"cnn/{variant}"]["verdict"] != "identical", rows[MKL_NODE]
    assert rows[DRILL_NODE]["cnn/strict"]["verdict"] != "identical", rows[DRILL_NODE]
    assert rows[THREAD_NODE]["probes/default"]["verdict"] != "identical", rows[THREAD_NODE]
    for node in STOCK_NODES:
        for key in COLUMNS:
            assert rows[node][key]["verdict"] == "identical", (node, key, rows[node][key])
    # A cell that differs leads to its comparison.
    for node, key in ((MKL_NODE, "cnn/default"), (DRILL_NODE, "cnn/strict")):
        href = rows[node][key]["href"]
        assert href and urlsplit(href).path == "/compare", (node, key, href)


def test_heatmap_is_complete_without_javascript(browser: Any, dashboard: Dashboard,
                                                reader_state: dict[str, Any]) -> None:
    context = browser.new_context(base_url=dashboard.base_url, java_script_enabled=False,
                                  storage_state=reader_state)
    try:
        page = context.new_page()
        page.goto("/")
        nodes = page.locator("#heatmap tbody tr[data-node]").evaluate_all(
            "rows => rows.map(r => r.dataset.node)")
        assert set(nodes) == NODES
        assert page.locator("#heatmap td.cell").count() >= len(NODES) * len(COLUMNS)
    finally:
        context.close()


# --- (c) from a cell to the comparison and its per-layer chart -------------------------


def test_cell_click_reaches_comparison_with_layer_chart(page: Any) -> None:
    page.goto("/")
    keys = page.locator("#heatmap th[data-key]").evaluate_all(
        "ths => ths.map(th => th.dataset.key)")
    column = keys.index("cnn/default")
    cell = page.locator(f"#heatmap tbody tr[data-node='{MKL_NODE}'] td.cell").nth(column)
    assert cell.get_attribute("data-verdict") != "identical"
    with page.expect_navigation():
        cell.locator("a.cell-link").click()

    query = parse_qs(urlsplit(page.url).query)
    assert urlsplit(page.url).path == "/compare"
    assert query.get("workload") == ["cnn"] and query.get("variant") == ["default"], query
    assert query.get("run_a") and query.get("run_b"), query

    box = wait_for_chart(page, "#layer-chart canvas")
    assert box["width"] > 0 and box["height"] > 0, box
    assert page.locator("#layer-chart .uplot").count() >= 1, "not drawn by uPlot"
    first = page.locator("#first-divergent").inner_text().strip()
    # The demo's report: MKL's cnn parts from the stock nodes at fc1.
    assert first and first != "none", first
    assert first == "fc1", first
    assert page.locator("#tensors tbody tr").count() > 0
    screenshot(page, "compare-from-heatmap")
    assert_no_console_errors(page)


# --- (d) every page loads without console errors; screenshots -------------------------


PAGES = {
    "overview": ("/", "#heatmap"),
    "workload-cnn": ("/workloads/cnn", "section.variant table.groups"),
    "node-lab-01": ("/nodes/lab-01", "#runs"),
    "compare": (None, "#layer-chart canvas"),
    "audit": ("/audit", "#suspects"),
}


@pytest.mark.parametrize("name", list(PAGES))
def test_page_loads_without_console_errors(page: Any, compare_path: str, name: str) -> None:
    path, selector = PAGES[name]
    response = page.goto(path or compare_path, wait_until="networkidle")
    assert response is not None and response.status == 200, response and response.status
    page.locator(selector).first.wait_for(state="visible")
    for canvas in page.locator("canvas").all():
        assert canvas.bounding_box(), "a chart canvas is not laid out"
    no_stack_trace(page)
    shot = screenshot(page, name)
    assert shot.stat().st_size > 0
    assert_no_console_errors(page)


def test_static_assets_are_served(page: Any) -> None:
    page.goto("/", wait_until="networkidle")
    assets = page.evaluate("""() => [
        ...[...document.querySelectorAll('script[src]')].map(s => s.src),
        ...[...document.querySelectorAll('link[rel=stylesheet]')].map(l => l.href)]""")
    names = " ".join(assets)
    assert "/static/" in names and "dashboard.js" in names and "dashboard.css" in names, assets
    for url in assets:
        response = page.request.get(url)
        assert response.status == 200, (url, response.status)


# --- (e) sortable tables ---------------------------------------------------------------


TABLE_JS = """(table) => {
  const head = table.tHead ? table.tHead.rows[table.tHead.rows.length - 1] : null;
  const headers = head ? [...head.children].map(c => c.textContent.trim()) : [];
  const rows = [...table.tBodies].flatMap(b => [...b.rows]).map(
      r => [...r.children].map(c => c.textContent.trim()));
  return {headers, rows};
}"""


def _sort_keys(values: list[str]) -> list[Any]:
    def natural(text: str) -> list[Any]:
        return [(0, float(p)) if re.fullmatch(r"\d+(\.\d+)?", p) else (1, p.casefold())
                for p in re.split(r"(\d+(?:\.\d+)?)", text) if p]

    keys: list[Any] = [lambda t: t.casefold(), natural]
    try:
        [float(v.replace(",", "")) for v in values]
        keys.insert(0, lambda t: float(t.replace(",", "")))
    except ValueError:
        pass
    return keys


def _is_sorted(values: list[str]) -> bool:
    for key in _sort_keys(values):
        ordered = sorted(values, key=key)
        if values in (ordered, ordered[::-1]):
            return True
    return False


def test_sortable_header_reorders_rows(page: Any) -> None:
    """The first sortable table (on the pages below) with a column of different values:
    a click on its header sorts the rows by it, a second click reverses them."""
    for path in ("/", "/audit", "/nodes/lab-drill", "/workloads/cnn"):
        page.goto(path)
        for table in page.locator("table.sortable").all():
            data = table.evaluate(TABLE_JS)
            rows = [r for r in data["rows"] if len(r) == len(data["headers"])]
            columns = [i for i in range(len(data["headers"]))
                       if len({r[i] for r in rows}) >= 2]
            if len(rows) < 2 or not columns:
                continue
            # Prefer a column whose values are all different (no ties).
            column = max(columns, key=lambda i: len({r[i] for r in rows}))
            header = table.locator("thead tr").last.locator(":scope > *").nth(column)
            header.click()
            first = table.evaluate(TABLE_JS)["rows"]
            header.click()
            second = table.evaluate(TABLE_JS)["rows"]
            where = f"{path}: column {data['headers'][column]!r}"
            assert sorted(map(tuple, first)) == sorted(map(tuple, data["rows"])), where
            assert sorted(map(tuple, second)) == sorted(map(tuple, data["rows"])), where
            once = [r[column] for r in first if len(r) == len(data["headers"])]
            twice = [r[column] for r in second if len(r) == len(data["headers"])]
            assert once != twice, f"{where}: a second click did not reorder {once}"
            assert twice == once[::-1], f"{where}: {once} then {twice}"
            assert _is_sorted(once), f"{where}: not sorted: {once}"
            assert_no_console_errors(page)
            return
    pytest.fail("no table.sortable with two rows of different values on these pages")


# --- (f) 404 and 422 pages -------------------------------------------------------------


@pytest.mark.parametrize(("path", "named"), [
    ("/nodes/no-such-node", "no-such-node"),
    ("/workloads/nope", "nope"),
])  # fmt: skip
def test_unknown_names_are_a_404_page(page: Any, path: str, named: str) -> None:
    response = page.goto(path)
    assert response is not None and response.status == 404
    assert "not found" in page.locator("h1").first.inner_text().lower()
    assert named in page.locator("body").inner_text()
    no_stack_trace(page)
    screenshot(page, f"404-{named}")


def test_compare_with_an_unknown_run_is_a_404_page(page: Any, api: httpx.Client) -> None:
    response = page.goto(f"/compare?run_a={latest_run(api, 'lab-01')}&run_b=no-such-run")
    assert response is not None and response.status == 404
    assert "not found" in page.locator("h1").first.inner_text().lower()
    assert "no-such-run" in page.locator("body").inner_text()
    no_stack_trace(page)


def test_wrong_typed_query_is_a_readable_422(page: Any, api: httpx.Client) -> None:
    assert api.get("/nodes/lab-01", params={"limit": "abc"}).status_code == 422
    response = page.goto("/nodes/lab-01?limit=abc")
    assert response is not None and response.status == 422
    message = page.locator("p.error").first
    assert message.is_visible()
    text = message.inner_text().strip()
    assert "limit" in text, text
    assert not text.startswith(("{", "[")), f"raw JSON, not a message: {text}"
    no_stack_trace(page)
    screenshot(page, "422-limit")


# --- (g) the node timeline -------------------------------------------------------------


def test_node_timeline_chart_draws(page: Any) -> None:
    page.goto("/nodes/lab-01")
    box = wait_for_chart(page, "#timeline-chart canvas")
    assert box["width"] > 0 and box["height"] > 0, box
    assert page.locator("#runs tbody tr").count() >= 1
    page.goto(f"/nodes/{DRILL_NODE}")
    wait_for_chart(page, "#timeline-chart canvas")
    runs = next(node.runs for node in FLEET if node.name == DRILL_NODE)
    assert page.locator("#runs tbody tr").count() == runs
    assert_no_console_errors(page)


# --- (h) the audit ---------------------------------------------------------------------


def test_audit_lists_the_drill_node_as_suspect(page: Any) -> None:
    page.goto("/audit")
    for table in ("#suspects", "#nondeterministic", "#stale", "#policy"):
        assert page.locator(f"table{table}").count() == 1, table
    suspects = page.locator("#suspects tbody tr").all_inner_texts()
    # The demo's audit has one suspect: the drilled node (its rows may name its peers).
    assert suspects and all(DRILL_NODE in row for row in suspects), suspects


# --- the workload page -----------------------------------------------------------------


def test_workload_page_groups_and_attribution(page: Any) -> None:
    page.goto("/workloads/cnn")
    for variant in VARIANTS:
        section = page.locator(f"section.variant[data-variant='{variant}']")
        assert section.count() == 1, variant
        groups = section.locator("table.groups tbody tr").all_inner_texts()
        listed = " ".join(groups)
        assert all(node in listed for node in NODES), (variant, groups)
        mkl_group = next(row for row in groups if MKL_NODE in row)
        assert STOCK_NODES[0] not in mkl_group, (variant, groups)
        assert section.locator("table.attribution").count() == 1, variant
    strict = page.locator("section.variant[data-variant='strict']")
    drill_group = next(row for row in strict.locator("table.groups tbody tr").all_inner_texts()
                       if DRILL_NODE in row)
    assert STOCK_NODES[0] not in drill_group, drill_group
    default = page.locator("section.variant[data-variant='default']")
    assert "MKL_CBWR" in default.locator("table.attribution").inner_text()


# --- charts that read right: the axis fits the data, the legends show values ----------

TIMELINE_SCALE_JS = """() => {
  const u = document.querySelector('#timeline-chart').uplot;
  const t = JSON.parse(document.getElementById('timeline-data').textContent).t;
  return {min: u.scales.x.min, max: u.scales.x.max, t};
}"""


def legend_values(page: Any, chart: str) -> list[str]:
    return [text.strip() for text in
            page.locator(f"{chart} .u-legend .u-value").all_inner_texts()]


@pytest.mark.parametrize("node", ["lab-01", DRILL_NODE])
def test_the_timeline_axis_spans_the_runs_not_hours(page: Any, node: str) -> None:
    """Two runs minutes apart fill the axis (it spanned two hours more than the runs);
    a lone run sits in a ten-minute window."""
    page.goto(f"/nodes/{node}")
    wait_for_chart(page, "#timeline-chart canvas")
    scale = page.evaluate(TIMELINE_SCALE_JS)
    first, last = scale["t"][0], scale["t"][-1]
    assert scale["min"] <= first and scale["max"] >= last, scale
    assert scale["max"] - scale["min"] <= max((last - first) * 1.25, 600), scale


def test_chart_legends_show_values_without_hovering(page: Any, compare_path: str) -> None:
    """A legend names what each series shows at a point (the first divergent layer, the
    newest run) before the pointer is on the chart, and while it is."""
    page.goto(compare_path)
    box = wait_for_chart(page, "#layer-chart canvas")
    values = legend_values(page, "#layer-chart")
    assert len(values) == 3 and all(v and v != "--" for v in values), values
    assert values[0] == "fc1 (first divergent)", values
    page.mouse.move(box["x"] + box["width"] * 0.1, box["y"] + box["height"] / 2)
    hovered = legend_values(page, "#layer-chart")
    assert all(v and v != "--" for v in hovered), hovered

    page.goto(f"/nodes/{DRILL_NODE}")
    wait_for_chart(page, "#timeline-chart canvas")
    values = legend_values(page, "#timeline-chart")
    assert len(values) == 4 and all(v and v != "--" for v in values), values
    assert "UTC" in values[0] and "(drill)" in values[1], values


def test_the_drill_comparison_names_the_drill_and_its_flipped_bit(page: Any,
                                                                    api: httpx.Client) -> None:
    page.goto(f"/compare?run_a={latest_run(api, STOCK_NODES[0])}"
              f"&run_b={latest_run(api, DRILL_NODE)}&workload=cnn&variant=strict")
    note = page.locator("p.note.drill").inner_text()
    assert note.startswith(f"Run b ({DRILL_NODE}) is a fault drill"), note
    flip = page.locator("section.pair .bit-flip").first.inner_text()
    assert re.fullmatch(r"one flipped bit: element \d+, bit 20, \S+ → \S+", flip), flip
