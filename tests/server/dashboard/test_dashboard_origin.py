"""The comparison and workload pages show where traced runs part: the first origin op,
its layer, shapes, kernels and output error, and the parting point (design §3.4)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from helpers.documents import run_document
from helpers.pages import Dashes
from helpers.traces import cnn_trace, with_traces

CNN = ("cnn", "default")


class Tables(HTMLParser):
    """The text of every cell of the tables of one class, row by row."""

    def __init__(self, html: str, table_class: str) -> None:
        super().__init__()
        self.table_class, self.depth, self.rows = table_class, 0, []
        self.cell: list[str] | None = None
        self.feed(html)
        self.rows = [row for row in self.rows if row]  # header rows have no td

    def handle_starttag(self, tag, attrs):
        if tag == "table" and self.table_class in (dict(attrs).get("class") or "").split():
            self.depth += 1
        elif self.depth and tag == "tr":
            self.rows.append([])
        elif self.depth and tag == "td":
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "table" and self.depth:
            self.depth -= 1
        elif tag == "td" and self.cell is not None:
            self.rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


@pytest.fixture
def traced_fleet(api):
    """Two stock nodes; one whose conv2 ran another kernel and gave other bits; one whose
    conv2 ran another algorithm (the sequences part); one without traces."""
    documents = [
        with_traces(run_document("stock-1", run_id="s1"), {CNN: cnn_trace()}),
        with_traces(run_document("stock-2", run_id="s2"), {CNN: cnn_trace()}),
        with_traces(run_document("mkl", run_id="m1", shift=1e-3,
                                 env_vars={"MKL_CBWR": "COMPATIBLE"}),
                    {CNN: cnn_trace(1e-3, conv2_kernel="conv:Mkldnn")}),
        with_traces(run_document("algo", run_id="a1", shift=2e-3,
                                 env_vars={"ALGO": "winograd"}),
                    {CNN: cnn_trace(2e-3, conv2_op="aten._winograd_convolution.default",
                                    extra_forward_ops=1)}),
        run_document("untraced", run_id="u1", shift=3e-3, env_vars={"OMP_NUM_THREADS": "1"}),
    ]
    for document in documents:
        assert api.post_run(document).status_code == 201, document["run_id"]
    return api


def page(api, path):
    response = api.client.get(path, headers=api.reader)
    assert response.status_code == 200, response.text[:2000]
    return response.text


def test_the_comparison_page_names_the_first_origin_op(traced_fleet):
    html = page(traced_fleet, "/compare?run_a=s1&run_b=m1&workload=cnn&variant=default")
    rows = Tables(html, "origin-ops").rows
    assert rows[1:] == []  # one origin op
    op_index, op, layer, phase, inputs, outputs, kernel_a, kernel_b, error = rows[0]
    assert (op_index, op, layer, phase) == ("2 / 2", "aten.convolution.default", "conv2",
                                            "forward")
    assert inputs == "float32[4, 32, 12, 12], float32[64, 32, 5, 5], float32[64]"
    assert outputs == "float32[4, 64, 4, 4]"
    assert (kernel_a, kernel_b) == ("—", "conv:Mkldnn")
    assert error.startswith("divergent, rel L2 ")
    assert "1 op ran on bit-identical inputs in both runs" in " ".join(html.split())


def test_the_comparison_page_names_the_parting_point(traced_fleet):
    html = " ".join(page(traced_fleet,
                         "/compare?run_a=s1&run_b=a1&workload=cnn&variant=default").split())
    assert "The op sequences part at op 2: a runs <code>aten.convolution.default</code> in " \
           "<code>conv2</code>" in html
    assert "b runs <code>aten._winograd_convolution.default</code>" in html


def test_the_comparison_page_says_a_run_has_no_trace(traced_fleet):
    html = page(traced_fleet, "/compare?run_a=s1&run_b=u1&workload=cnn&variant=default")
    assert not Tables(html, "origin-ops").rows
    assert ("Origin ops: run b&#39;s result has no op trace: run the agent with "
            "--trace-ops.") in html


def test_the_workload_page_shows_each_pair_s_first_origin_op(traced_fleet):
    html = page(traced_fleet, "/workloads/cnn")
    rows = {row[0]: row for row in Tables(html, "origin-ops").rows}
    # Groups: 1 stock (2 nodes), then algo, mkl, untraced by first node name.
    mkl = rows["1 vs 3"]
    assert mkl[1].startswith("aten.convolution.default") and mkl[2] == "conv2"
    assert (mkl[6], mkl[7]) == ("—", "conv:Mkldnn") and mkl[8].startswith("divergent")
    algo = rows["1 vs 2"]
    assert algo[1] == "—" and "part at op 2" in algo[9]
    assert "1 vs 4" not in rows
    assert "1 vs 4: group 4&#39;s representative (untraced) has no op trace" in html


@pytest.mark.parametrize("path", [
    "/workloads/cnn", "/compare?run_a=s1&run_b=m1", "/compare?run_a=s1&run_b=a1",
    "/compare?run_a=s1&run_b=u1"])
def test_every_dash_of_the_origin_tables_says_why(traced_fleet, path):
    assert Dashes(page(traced_fleet, path)).unexplained == []
