"""The dashboard's pinned answers (design §3.4, §3.11): the audit page lists the pins in
force and the drift from them, the workload page says where the pinned answer went."""

from __future__ import annotations

from bs4 import BeautifulSoup
from helpers.documents import audit_document

MKL = {"MKL_CBWR": "COMPATIBLE"}


def text(tag) -> str:
    return " ".join(tag.get_text(" ").split())


def test_the_pages_show_the_pin_and_the_fleet_that_moved_from_it(api):
    for i in (1, 2, 3):
        assert api.post_run(audit_document(f"node-{i}", 3)).status_code == 201
    pinned = api.client.post("/api/v1/goldens", headers=api.admin, json={
        "source": "majority", "node": "node-1", "variants": ["strict"],
        "reason": "validated for the 2026-11 run"}).json()
    page = BeautifulSoup(api.client.get("/audit", headers=api.reader).text, "html.parser")
    (row,) = page.select("#pins tbody tr")
    assert row["data-pin"] == str(pinned["id"])
    assert "validated for the 2026-11 run" in text(row) and "test-admin" in text(row)
    assert "Every device in a pin's scope gives the pinned answers." in text(
        page.select_one("#pinned-drift"))

    for i in (1, 2, 3):
        assert api.post_run(audit_document(f"node-{i}", 1, env_vars=MKL, shift=2e-3)
                            ).status_code == 201
    page = BeautifulSoup(api.client.get("/audit", headers=api.reader).text, "html.parser")
    (row,) = page.select("#pinned-drift tbody tr")
    assert (row["data-workload"], row["data-variant"]) == ("cnn", "strict")
    assert "3 of 3" in text(row) and "yes: its peers agree" in text(row)
    assert "from conv2" in text(row)
    assert text(page.select_one('[data-status="off-pin"]')) == "3 devices off their pin"

    workload = BeautifulSoup(api.client.get("/workloads/cnn", headers=api.reader).text,
                             "html.parser")
    (note,) = workload.select('section[data-variant="strict"] p.pin')
    assert note["data-drift"] == "yes"
    assert "no device gives it now" in text(note) and "0 of the 3 devices" in text(note)
    assert "first divergent layer conv2" in text(note)
    assert not workload.select('section[data-variant="default"] p.pin')  # not pinned
