"""The usual answer is not taken for the right one (issue 28).

Most nodes of a fleet are stock GPUs whose answer is off from the float64 one by far
more than the strict CPU answer is (TF32 on a real H200): their answer is the usual one,
so the fleet page showed it identical ★ in green. The fp64 judge calls it not
acceptable, and the fleet page and the demo's report say so; the CPU's answer, judged
acceptable, is not marked.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from helpers.documents import b64, gpu_document, run_document

from numparity_server.analysis.policy import Policy
from numparity_server.demo_report import build_report, format_findings
from numparity_server.kit.db import get_engine, session_factory

REFERENCE = np.random.default_rng(28).standard_normal(64)  # the float64 answer
STRICT = REFERENCE.astype(np.float32)  # the CPU's: float32 rounding only
OFF = (REFERENCE + 1e-3).astype(np.float32)  # the GPUs': off by far more


def output(values: np.ndarray) -> list[dict[str, Any]]:
    dtype = {np.float64: "float64", np.float32: "float32"}[values.dtype.type]
    code = {"float64": "f8", "float32": "f4"}[dtype]
    raw = np.ascontiguousarray(values, dtype=np.dtype(code).newbyteorder("<")).tobytes()
    shape = list(values.shape)
    digest = hashlib.sha256(f"{dtype};{','.join(map(str, shape))};".encode() + raw).hexdigest()
    return [{"name": "output", "kind": "output", "order": 0, "hash": digest, "dtype": dtype,
             "shape": shape, "values": {"dtype": dtype, "data": b64(values, code)}}]


def fleet(api: Any) -> None:
    cpu = run_document("cpu-ref", variants=("fp64-reference", "strict", "default"))
    answers = {"fp64-reference": REFERENCE, "strict": STRICT, "default": STRICT}
    for result in cpu["results"]:
        if result["status"] == "ok":
            result["tensors"] = output(answers[result["variant"]])
    assert api.post_run(cpu).status_code == 201
    for n in range(3):
        gpu = gpu_document(f"gpu-{n}", 1, [f"uuid-{n}"])
        gpu["results"] = [{**gpu["results"][0], "variant": "default", "tensors": output(OFF)}]
        assert api.post_run(gpu).status_code == 201


def test_a_usual_answer_the_fp64_judge_rejects_is_marked(api):
    fleet(api)
    html = api.client.get("/", headers=api.reader).text
    assert html.count('data-fp64="unacceptable"') == 3  # the three GPUs' cells
    assert "The usual answer is not the right one here" in html
    assert "cnn/default</strong> on cuda/NVIDIA A100-SXM4-80GB/8.0" in html
    assert "output&#39;s rmse against float64" in html or "output's rmse against float64" in html
    cpu_row = html[html.index('data-node="cpu-ref"'):]
    cpu_row = cpu_row[:cpu_row.index("</tr>")]
    assert "unacceptable" not in cpu_row  # the CPU's answer is judged acceptable

    with session_factory(get_engine(api.settings))() as session:
        report = build_report(session=session, policy=Policy(), suite="standard", drills={},
                              node_costs={})
    text = format_findings(report)
    assert ("the usual answer of cnn/default on cuda/NVIDIA A100-SXM4-80GB/8.0 is not the "
            "right one: the fp64 judge calls it not acceptable") in text
