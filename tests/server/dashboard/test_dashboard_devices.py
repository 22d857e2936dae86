"""The dashboard with several devices per node (issue 18): the fleet page puts each GPU in
a row under its node, folded when they agree and open when one disagrees; GPUs of one
model share a baseline whatever their slot; the node page lists its devices with the
audit's verdict on each; the audit page names the suspect GPU."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers.documents import cnn_tensors, gpu_document

GPUS = [f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}" for i in range(4)]
AGREEING = [f"GPU-{i:08d}-dddd-eeee-ffff-{i:012d}" for i in range(4)]
BAD = GPUS[2]  # at cuda:2 of gpu-node-1


class Heatmap(HTMLParser):
    """The heatmap as {node: {"attrs", "open", "cells", "devices": {slot: {"attrs",
    "cells"}}}}, each cells {"workload/variant": (verdict, href)}."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.columns: list[str] = []
        self.nodes: dict[str, dict] = {}
        self._row: dict | None = None
        self._cell: list[str | None] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "th" and "data-key" in a:
            self.columns.append(a["data-key"] or "")
        elif tag == "tr" and "data-node" in a:
            self._row = {"attrs": a, "open": None, "cells": {}, "devices": {}}
            self.nodes[a["data-node"] or ""] = self._row
        elif tag == "tr" and "data-device-of" in a:
            self._row = {"attrs": a, "cells": {}}
            self.nodes[a["data-device-of"] or ""]["devices"][a["data-device"]] = self._row
        elif tag == "details" and self._row is not None:
            self._row["open"] = "open" in a
        elif tag == "td" and a.get("class") == "cell" and self._row is not None:
            self._cell = [a.get("data-verdict"), None]
        elif tag == "a" and self._cell is not None:
            self._cell[1] = a.get("href")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._row is not None:
            cells = self._row["cells"]
            cells[self.columns[len(cells)]] = tuple(self._cell)
            self._cell = None


def upload(api, *documents):
    for document in documents:
        response = api.post_run(document)
        assert response.status_code == 201, response.text


def page(api, path):
    response = api.client.get(path, headers=api.reader)
    assert response.status_code == 200, response.text[:2000]
    return response.text


def with_fp64_on_the_cpu(document):
    """The run as the agent sends it from a GPU node: fp64-reference once, on the CPU."""
    document["devices"].append({"device": "cpu", "type": "cpu", "index": None, "uuid": None,
                                "serial": None, "pci_bus_id": None, "name": "Xeon",
                                "compute_capability": None, "mig": False, "wall_s": 2.0,
                                "status": "ok"})
    document["results"].append({**document["results"][0], "variant": "fp64-reference",
                                "device": "cpu", "tensors": cnn_tensors()})
    return document


@pytest.fixture
def gpu_fleet(api):
    """Two 4-GPU nodes of one model on one environment: gpu-node-1's cuda:2 computes
    wrong (twice: suspect), gpu-node-2's GPUs all agree."""
    upload(api, *(gpu_document("gpu-node-1", hours, GPUS, shifted={BAD: 1e-3})
                  for hours in (3, 2)),
           with_fp64_on_the_cpu(gpu_document("gpu-node-2", 2, AGREEING)))
    return api


def test_a_gpu_that_disagrees_opens_its_nodes_device_rows(gpu_fleet):
    api = gpu_fleet
    heat = Heatmap(page(api, "/"))
    assert heat.columns == ["cnn/strict", "cnn/fp64-reference"]
    node = heat.nodes["gpu-node-1"]
    assert node["attrs"]["data-devices"] == "4" and node["attrs"]["data-agree"] == "no"
    assert node["open"] is True
    assert list(node["devices"]) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [d["attrs"]["data-uuid"] for d in node["devices"].values()] == GPUS
    verdicts = {slot: d["cells"]["cnn/strict"][0] for slot, d in node["devices"].items()}
    assert verdicts == {"cuda:0": "identical", "cuda:1": "identical", "cuda:2": "divergent",
                        "cuda:3": "identical"}
    # The node's own cell is the worst of its devices'.
    assert node["cells"]["cnn/strict"][0] == "divergent"
    # Its GPUs and gpu-node-2's are one model: one baseline, gpu-node-1's first GPU (★,
    # linked to its node), whatever slot the others sit at.
    assert node["devices"]["cuda:0"]["cells"]["cnn/strict"][1] == "/nodes/gpu-node-1"
    other = heat.nodes["gpu-node-2"]["devices"]
    assert {d["cells"]["cnn/strict"][0] for slot, d in other.items()
            if slot != "cpu"} == {"identical"}

    # The bad GPU's cell links to the comparison of its result with the baseline's own
    # GPU (gpu-node-1's cuda:0: GET /compare by device). That comparison says what the
    # cell says.
    query = parse_qs(urlsplit(node["devices"]["cuda:2"]["cells"]["cnn/strict"][1]).query)
    assert (query["device_a"], query["device_b"]) == (["cuda:0"], ["cuda:2"])
    compared = api.client.get("/api/v1/compare", headers=api.reader,
                              params={k: v[0] for k, v in query.items()}).json()
    assert (compared["run_a"]["node"], compared["run_b"]["node"]) == ("gpu-node-1",
                                                                       "gpu-node-1")
    (pair,) = compared["pairs"]
    assert pair["summary"]["result_verdict"]["verdict"] == "divergent"


def test_in_a_lab_of_one_node_the_bad_gpus_cell_leads_to_its_devices(api):
    """One 4-GPU node: its GPUs are each other's peers; the bad GPU's cell compares it
    with a sibling GPU of the same run."""
    upload(api, gpu_document("solo", 1, GPUS, shifted={BAD: 1e-3}))
    html = page(api, "/")
    node = Heatmap(html).nodes["solo"]
    assert node["open"] is True and node["cells"]["cnn/strict"][0] == "divergent"
    verdict, href = node["devices"]["cuda:2"]["cells"]["cnn/strict"]
    query = parse_qs(urlsplit(href).query)
    assert verdict == "divergent" and query["run_a"] == query["run_b"]
    assert (query["device_a"], query["device_b"]) == (["cuda:0"], ["cuda:2"])
    assert node["devices"]["cuda:0"]["cells"]["cnn/strict"] == ("identical", "/nodes/solo")
    # There the audit watches it (one run), compared with a sibling GPU of its run.
    devices = page(api, "/nodes/solo").split('<table id="devices"')[1].split("</table>")[0]
    (row,) = re.findall(rf'<tr data-device="cuda:2" data-uuid="{BAD}">(.*?)</tr>', devices, re.S)
    assert '<td data-status="watch"' in row and "compare with a peer" in row
    assert "device_b=cuda%3A2" in unescape(row)
    compare_page = page(api, unescape(re.search(r'href="(/compare\?[^"]+)"', row).group(1)))
    assert "divergent" in compare_page


def test_a_node_whose_gpus_agree_shows_them_folded(gpu_fleet):
    heat = Heatmap(page(gpu_fleet, "/"))
    node = heat.nodes["gpu-node-2"]
    # Its CPU ran only fp64-reference (as the agent does on a GPU node): not a
    # disagreement, and the GPUs' rows say they do not run it.
    assert node["attrs"]["data-devices"] == "5" and node["attrs"]["data-agree"] == "yes"
    assert node["open"] is False
    assert list(node["devices"]) == ["cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert node["cells"] == {"cnn/fp64-reference": ("identical", "/nodes/gpu-node-2"),
                             "cnn/strict": node["devices"]["cuda:0"]["cells"]["cnn/strict"]}
    assert node["devices"]["cpu"]["cells"]["cnn/strict"][0] == "missing"
    assert {node["devices"][f"cuda:{i}"]["cells"]["cnn/fp64-reference"][0]
            for i in range(4)} == {"missing"}
    assert {node["devices"][f"cuda:{i}"]["cells"]["cnn/strict"][0]
            for i in range(4)} == {"identical"}


def test_a_gpu_whose_child_crashed_fails_its_own_cells_and_marks_its_node(api):
    document = gpu_document("gpu-x", 1, GPUS)
    document["devices"][1]["status"] = "failed"
    document["results"][1] = {key: document["results"][1][key]
                              for key in ("suite", "workload", "variant", "device")}
    document["results"][1].update(status="failed", error="variant strict timed out")
    upload(api, document)
    node = Heatmap(page(api, "/")).nodes["gpu-x"]
    assert node["open"] is True and node["cells"]["cnn/strict"][0] == "failed"
    assert [d["cells"]["cnn/strict"][0] for d in node["devices"].values()] == [
        "identical", "failed", "identical", "identical"]


def test_a_node_with_one_device_has_no_device_rows(gpu_fleet):
    api = gpu_fleet
    upload(api, gpu_document("gpu-node-3", 1, AGREEING[:1]))
    html = page(api, "/")
    node = Heatmap(html).nodes["gpu-node-3"]
    assert node["devices"] == {} and node["open"] is None
    assert "data-devices" not in node["attrs"]
    assert node["cells"]["cnn/strict"][0] == "identical"
    # The legend counts the node rows' cells: 3 nodes × 2 columns.
    counts = dict(re.findall(r'data-verdict="(\w+)"></span>\w+\s*<span class="count">(\d+)',
                             html))
    assert counts == {"identical": "3", "equivalent": "0", "divergent": "1",
                      "nonfinite": "0", "broken": "0", "failed": "0", "skipped": "0",
                      "missing": "2"}


def test_the_node_page_lists_its_devices_and_the_audits_status(gpu_fleet):
    api = gpu_fleet
    html = page(api, "/nodes/gpu-node-1")
    table = html.split('<table id="devices"')[1].split("</table>")[0]
    rows = re.findall(r'<tr data-device="([^"]+)" data-uuid="([^"]+)">(.*?)</tr>', table, re.S)
    assert [(slot, uuid) for slot, uuid, _ in rows] == [
        (f"cuda:{i}", uuid) for i, uuid in enumerate(GPUS)]
    audit = api.client.get("/api/v1/audit", headers=api.reader).json()
    (suspect,) = audit["suspects"]
    for slot, uuid, row in rows:
        assert f"<code>{uuid}</code>" in row and f"serial-{uuid}" in row
        assert f"00000000:{int(slot[5:]):02x}:00.0" in row
        assert "NVIDIA A100-SXM4-80GB" in row
        if uuid == BAD:
            assert '<td data-status="suspect"' in row
            assert suspect["detail"].replace("'", "&#39;") in row
            compare = suspect["compare"]
            # The peer holding the usual answer may sit on another node or beside the
            # suspect in the same run: either way the link compares two devices.
            assert "compare with a peer" in row and compare["run_a"]
            assert (compare["run_a"], compare["device_a"]) != (compare["run_b"],
                                                               compare["device_b"])
        else:
            assert '<td data-status="none">' in row
    # gpu-node-2 also lists the CPU its fp64-reference ran on.
    other = page(api, "/nodes/gpu-node-2").split('<table id="devices"')[1].split("</table>")[0]
    assert re.findall(r'<tr data-device="([^"]+)"', other) == [
        "cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_the_audit_page_names_the_suspect_gpu(gpu_fleet):
    api = gpu_fleet
    html = page(api, "/audit")
    suspects = html.split('<table id="suspects"')[1].split("</table>")[0]
    (row,) = re.findall(r'<tr data-node="gpu-node-1">(.*?)</tr>', suspects, re.S)
    assert '<td data-device="cuda:2"' in row
    assert f"<code>{BAD}</code>" in row and f"serial serial-{BAD}" in row
    assert "NVIDIA A100-SXM4-80GB" in row
    assert '<td data-status="suspect">suspect</td>' in row


def test_the_suspects_page_shows_its_gpus_readings_beside_the_audits_status(api):
    """Issue 44: NVML's readings at the newest run's start and end, beside the verdict."""
    hot = {"start": {"temperature_c": 71, "sm_clock_mhz": 1410, "power_w": 250.5,
                     "ecc_corrected_volatile": 3, "remapped_rows_corrected": 1},
           "end": {"temperature_c": 88, "sm_clock_mhz": 1275, "power_w": 402.0,
                   "ecc_corrected_volatile": 5, "remapped_rows_corrected": 1}}
    documents = [gpu_document("gpu-node-1", hours, GPUS, shifted={BAD: 1e-3})
                 for hours in (3, 2)]
    documents[1]["devices"][2]["telemetry"] = hot
    documents[1]["devices"][0]["telemetry"] = {"start": {"temperature_c": 40}}
    upload(api, *documents, with_fp64_on_the_cpu(gpu_document("gpu-node-2", 2, AGREEING)))
    node = api.client.get("/api/v1/nodes/gpu-node-1", headers=api.reader).json()
    by_slot = {t["device"]: t for t in node["telemetry"]}
    assert set(by_slot) == {"cuda:0", "cuda:2"}
    assert by_slot["cuda:2"]["uuid"] == BAD and by_slot["cuda:2"]["start"] == hot["start"]
    assert by_slot["cuda:2"]["end"] == hot["end"]
    assert by_slot["cuda:2"]["run_id"] == documents[1]["run_id"]
    html = page(api, "/nodes/gpu-node-1")
    table = html.split('<table id="telemetry"')[1].split("</table>")[0]
    rows = dict(re.findall(r'<tr data-device="([^"]+)">(.*?)</tr>', table, re.S))
    assert set(rows) == {"cuda:0", "cuda:2"}
    suspect = rows["cuda:2"]
    assert "71 → 88" in suspect and "1410 → 1275" in suspect and "250.5 → 402.0" in suspect
    assert "3 → 5" in suspect and '<td data-status="suspect"' in suspect
    assert '<td data-status="none">' in rows["cuda:0"] and "40 → —" in rows["cuda:0"]
    # A node whose runs carried none has no such table.
    assert '<table id="telemetry"' not in page(api, "/nodes/gpu-node-2")


def test_a_reading_that_is_not_a_number_is_refused(api):
    document = gpu_document("gpu-node-3", 1, GPUS[:1])
    document["devices"][0]["telemetry"] = {"start": {"temperature_c": "hot"}}
    response = api.post_run(document)
    assert response.status_code in (400, 422), response.text
