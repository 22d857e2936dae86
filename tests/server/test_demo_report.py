"""The demo's report names, for each split, the op where it parts from the usual answer
when the nodes traced their ops; without traces it says what it said before."""

from __future__ import annotations

from helpers.documents import run_document
from helpers.traces import cnn_trace, with_traces

from numparity_server.analysis.policy import Policy
from numparity_server.demo_report import build_report, format_findings
from numparity_server.kit.db import get_engine, session_factory

CNN = ("cnn", "default")


def report_text(api) -> str:
    with session_factory(get_engine(api.settings))() as session:
        report = build_report(session=session, policy=Policy(), suite="standard", drills={},
                              node_costs={})
    return format_findings(report)


def split_lines(text: str, node: str) -> list[str]:
    """The finding line of ``node``'s split and the indented lines under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("    cnn/default") and f" {node} against " in line)
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("      "):
            break
        block.append(line.strip())
    return block


def test_each_traced_split_names_its_origin_op_or_where_the_sequences_part(api):
    for document in (
        with_traces(run_document("lab-01"), {CNN: cnn_trace()}),
        with_traces(run_document("lab-02"), {CNN: cnn_trace()}),
        with_traces(run_document("lab-mkl", shift=1e-3, env_vars={"MKL_CBWR": "COMPATIBLE"}),
                    {CNN: cnn_trace(1e-3, conv2_kernel="conv:Mkldnn")}),
        with_traces(run_document("lab-algo", shift=2e-3, env_vars={"ALGO": "winograd"}),
                    {CNN: cnn_trace(2e-3, conv2_op="aten._winograd_convolution.default",
                                    extra_forward_ops=1)}),
        run_document("lab-untraced", shift=3e-3, env_vars={"OMP_NUM_THREADS": "1"}),
    ):
        assert api.post_run(document).status_code == 201
    text = report_text(api)

    mkl = split_lines(text, "lab-mkl")
    assert ("origin op aten.convolution.default in conv2 (forward, op 2; 1 in all): its "
            "output divergent, rel L2 0.000988; kernels not recorded vs conv:Mkldnn") in mkl
    algo = split_lines(text, "lab-algo")
    assert ("no origin op; the op sequences part at op 2: aten.convolution.default vs "
            "aten._winograd_convolution.default") in algo
    untraced = split_lines(text, "lab-untraced")
    assert not [line for line in untraced if "origin op" in line or "op sequences" in line]


def test_an_untraced_fleet_reports_as_before(api):
    for document in (run_document("lab-01"), run_document("lab-02"),
                     run_document("lab-mkl", shift=1e-3, env_vars={"MKL_CBWR": "COMPATIBLE"})):
        assert api.post_run(document).status_code == 201
    mkl = split_lines(report_text(api), "lab-mkl")
    assert mkl[1:] == ["max abs 0.001, max rel 6.25, max ULP 1944293990; from values",
                       "first divergent layer: conv2"]
