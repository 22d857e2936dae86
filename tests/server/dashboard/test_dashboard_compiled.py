"""The node page's "Compiled against eager" table (design §3.4, §3.3.18)."""

from __future__ import annotations

from helpers.documents import cnn_tensors, run_document


def test_the_node_page_shows_the_newest_runs_compiled_verdicts(api):
    older = run_document("node-c", run_id="plain", started_at="2026-11-20T10:00:00Z")
    newer = run_document("node-c", run_id="with-compiled", started_at="2026-11-21T10:00:00Z",
                         variants=("default", "fp64-reference"))
    newer["results"].append({**newer["results"][0], "variant": "compiled",
                             "tensors": cnn_tensors(1e-3)})
    for document in (older, newer):
        assert api.post_run(document).status_code == 201
    response = api.client.get("/nodes/node-c", headers=api.reader)
    assert response.status_code == 200, response.text
    html = response.text
    assert '<table id="compiled"' in html
    assert 'data-workload="cnn" data-device="cpu" data-verdict="divergent"' in html
    assert "<td>conv2</td>" in html  # the first divergent layer
    assert "eager <small>(RMSE" in html  # float64 backs eager's answer here
    # A node whose newest run has no compiled result shows no such table.
    assert api.post_run(run_document("node-e", run_id="eager-only")).status_code == 201
    plain = api.client.get("/nodes/node-e", headers=api.reader)
    assert plain.status_code == 200 and 'id="compiled"' not in plain.text
