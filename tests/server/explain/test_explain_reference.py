"""GET /api/v1/agent/reference/{run_id} (design §2.11, §3.2): a run as `explain` reads it,
and nothing else of the run or its node."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from helpers.documents import gpu_document, rekey, run_document
from sqlalchemy import event

from numparity_server.auth import service as auth_service
from numparity_server.kit.db import get_engine, session_factory

UUIDS = ["GPU-11111111-2222-4333-8444-555555555555", "GPU-66666666-7777-4888-8999-000000000000"]


def reference(api: Any, run_id: str, headers: dict[str, str] | None = None,
              **params: str) -> Any:
    return api.client.get(f"/api/v1/agent/reference/{run_id}", params=params,
                          headers=api.agent if headers is None else headers)


def bound_agent(api: Any, node: str) -> dict[str, str]:
    with session_factory(get_engine(api.settings))() as session:
        created = auth_service.create_token(session=session, role="agent", label="bound",
                                            node_names=(node,))
    return {"Authorization": f"Bearer {created.token}"}


def gpu_run() -> dict[str, Any]:
    """Two GPUs known by UUID and serial, a label, a host name, a failed and a skipped
    result, and CUDA_VISIBLE_DEVICES naming the GPUs by UUID."""
    document = gpu_document("secret-node", 2, UUIDS)
    document["node"]["labels"] = {"owner": "secret-owner"}
    document["environment"]["env_vars"] = {"MKL_CBWR": "COMPATIBLE",
                                           "CUDA_VISIBLE_DEVICES": ",".join(UUIDS)}
    document["environment"]["platform"]["hostname"] = "secret-host"
    document["environment"]["torch"].update(mkl_available=True, mkldnn_available=True)
    rekey(document["environment"])
    failed = {**document["results"][0], "status": "failed", "error": "boom",
              "device": "cuda:0", "variant": "default", "tensors": []}
    document["results"].append(failed)
    return document


def test_the_reference_reveals_exactly_what_explain_needs(api):
    document = gpu_run()
    assert api.post_run(document).status_code == 201

    answer = reference(api, document["run_id"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"run_id", "environment", "results"}
    environment = body["environment"]
    assert set(environment) == {"env_key", "env_vars", "threads", "knobs", "cpu", "torch",
                                "gpus"}
    assert set(environment["threads"]) == {"num_threads", "num_interop_threads"}
    assert set(environment["cpu"]) == {"model", "capability", "logical_cpus"}
    assert set(environment["torch"]) == {"version", "git_version", "cuda", "cudnn",
                                         "mkl_available", "mkldnn_available"}
    assert [set(gpu) for gpu in environment["gpus"]] == [{"name", "compute_capability"}] * 2
    stored_env = document["environment"]
    assert environment["env_key"] == stored_env["env_key"]
    # CUDA_VISIBLE_DEVICES names GPUs (here by UUID) and is not a numeric setting.
    assert environment["env_vars"] == {"MKL_CBWR": "COMPATIBLE"}
    assert environment["threads"] == {"num_threads": 2, "num_interop_threads": 2}
    assert environment["knobs"] == stored_env["knobs"]
    assert environment["cpu"] == {"model": "Xeon", "capability": "AVX512", "logical_cpus": 2}
    assert environment["torch"] == {"version": "2.13.0", "git_version": "abc", "cuda": None,
                                    "cudnn": None, "mkl_available": True,
                                    "mkldnn_available": True}
    assert environment["gpus"] == [{"name": "NVIDIA A100-SXM4-80GB",
                                    "compute_capability": "8.0"}] * 2

    # Only ok results, each with its tensors (name, kind, hash) in execution order.
    ok = [r for r in document["results"] if r["status"] == "ok"]
    assert len(body["results"]) == len(ok) == 2
    for got, sent in zip(body["results"], ok, strict=True):
        assert set(got) == {"suite", "workload", "workload_version", "variant", "device",
                            "status", "input_hash", "param_hash", "tensors"}
        assert {k: got[k] for k in got if k != "tensors"} == {
            k: sent[k] for k in ("suite", "workload", "workload_version", "variant", "device",
                                 "status", "input_hash", "param_hash")}
        assert got["tensors"] == [{"name": t["name"], "kind": t["kind"], "hash": t["hash"]}
                                  for t in sent["tensors"]]
    # No node name, labels, host name, device identities, statistics or values.
    for secret in ("secret-node", "secret-owner", "secret-host", *UUIDS, "serial-",
                   "stats", "sketch", "values", "l2", "labels", "manifest"):
        assert secret not in answer.text, secret


def test_filters_unknown_runs_and_who_may_read(api):
    document = run_document("lab-mkl", workloads=("cnn", "mlp"), variants=("default", "strict"))
    assert api.post_run(document).status_code == 201
    run_id = document["run_id"]

    keys = [(r["workload"], r["variant"]) for r in reference(
        api, run_id, workload="mlp").json()["results"]]
    assert keys == [("mlp", "default"), ("mlp", "strict")]
    keys = [(r["workload"], r["variant"]) for r in reference(
        api, run_id, workload="cnn", variant="strict").json()["results"]]
    assert keys == [("cnn", "strict")]
    assert reference(api, run_id, variant="tf32").json()["results"] == []  # skipped only

    missing = reference(api, "no-such-run")
    assert missing.status_code == 404
    assert missing.json() == {"error": "not_found", "detail": "no run with run_id 'no-such-run'"}

    # A token bound to another node reads it: explaining against another node is the point.
    assert reference(api, run_id, bound_agent(api, "lab-01")).status_code == 200
    assert reference(api, run_id, api.reader).status_code == 403
    assert reference(api, run_id, {}).status_code == 401


@contextmanager
def counting(api: Any) -> Iterator[list[str]]:
    statements: list[str] = []
    engine = get_engine(api.settings)

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_the_reference_is_read_in_a_fixed_number_of_queries(api):
    small = run_document("small", workloads=("cnn",))
    large = run_document("large", workloads=("cnn", "mlp", "lstm", "attention", "probes"),
                         variants=("default", "strict", "fp64-reference"), shift=0.5)
    for document in (small, large):
        assert api.post_run(document).status_code == 201
    counts = []
    for document in (small, large):
        with counting(api) as statements:
            assert reference(api, document["run_id"]).status_code == 200
        counts.append(len(statements))
    # The token, the run with its environment, its results, their manifests.
    assert counts[0] == counts[1] == 4, counts
