"""The OpenAPI schema tells the truth: schemathesis drives every operation of the app.

Every operation in ``/openapi.json``, with an agent token and with a reader token, on
SQLite and on PostgreSQL, against a small stored fleet: schemathesis's examples,
coverage (boundaries, every undeclared method) and fuzzing phases, positive and negative
data, and all its checks: no 5xx; every status, content type, header and body as the
schema declares; valid data accepted and invalid data refused; a 405 for an undeclared
method with an ``Allow`` naming the methods. Deterministic (the same requests on every
run) and small per operation, so the module stays well within 3 minutes on two cores.

schemathesis's engine is used rather than its pytest plugin (``@schema.parametrize``),
which does not run under pytest 9.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from helpers.documents import audit_document
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema

# Examples drawn per operation and phase.
MAX_EXAMPLES = 12

# POST /runs: rules over several fields (or over what the server holds) that JSON Schema
# cannot state, each a 422 naming the field (the manual's API reference): results unique by (suite,
# workload, variant, device), tensor names unique in a result, an array's data a whole
# number of its dtype's elements and as many as k, m or the shape says, full values whose
# sha256 is the tensor's hash, references to fingerprints, manifests and op traces the
# server holds; an op trace's hash covering its body, every reference of its ops a key
# of its tensors, each body sent once and referred to by a result. Schema-valid
# documents that break one are refused; everything else is checked.
RULES_BEYOND_JSON_SCHEMA = {"include-path": "/api/v1/runs", "include-method": "POST",
                            "checks": {"positive_data_acceptance": {"expected-statuses": [
                                "2xx", "401", "403", "409", "422"]}}}
# POST /explanations: the findings name a node that has uploaded a run, a stored run
# (`against`) and ok results of that run, each once; a 422 naming the field otherwise.
FINDINGS_OF_STORED_RUNS = {"include-path": "/api/v1/explanations", "include-method": "POST",
                           "checks": {"positive_data_acceptance": {"expected-statuses": [
                               "2xx", "401", "403", "422"]}}}

# Uploads in parts: a part continues the bytes held (a 409 naming the offset otherwise)
# and ends within the upload's total, which the server's limits bound (a 413 naming the
# limit otherwise); the values of a stored fingerprint only (404), the run of a complete
# upload only (404, 409), whose bytes are their name's (422).
PARTS_OF_STORED_UPLOADS = {"include-path-regex": "^/api/v1/(uploads|values)/",
                           "checks": {"positive_data_acceptance": {"expected-statuses": [
                               "2xx", "401", "403", "404", "409", "413", "422"]}}}


@pytest.fixture(params=["agent", "reader"])
def contract_run(request: pytest.FixtureRequest, make_api: Callable[..., Any]
                 ) -> tuple[int, dict[tuple[str, str], list[str]]]:
    # A thousand requests in seconds from one token is over any token's byte budget by
    # design (429, documented); the contract is checked with the budget off.
    api = make_api(token_bytes_per_s=0)
    for node, hours_ago, shift in (("peer-1", 2, 0.0), ("peer-2", 3, 0.0), ("odd-1", 4, 1e-3)):
        stored = api.post_run(audit_document(node, hours_ago, shift=shift))
        assert stored.status_code == 201, stored.text
    config = SchemathesisConfig.from_dict({
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "mode": "all",
                       "database": "none"},
        "phases": {"stateful": {"enabled": False}},
        "headers": dict(getattr(api, request.param)),
        "operations": [PARTS_OF_STORED_UPLOADS, RULES_BEYOND_JSON_SCHEMA,
                       FINDINGS_OF_STORED_RUNS],
    })
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.client.app, config=config)
    return run(schema)


def run(schema: Any) -> tuple[int, dict[tuple[str, str], list[str]]]:
    """Requests sent, and the failures by (operation, check) with their curl commands."""
    requests = 0
    failures: dict[tuple[str, str], list[str]] = {}
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            requests += len(recorder.interactions)
            for checks in recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failures.setdefault((recorder.label, check.name), []).append(
                            f"{check.failure_info.failure}\n{check.failure_info.code_sample}")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            failures.setdefault((getattr(event, "label", "engine"), "error"), []).append(
                str(getattr(event, "value", None) or getattr(event, "exception", event)))
    return requests, failures


def test_every_operation_answers_as_its_schema_says(
        contract_run: tuple[int, dict[tuple[str, str], list[str]]]) -> None:
    requests, failures = contract_run
    assert requests > 500  # every operation was exercised, not skipped
    assert not failures, "\n\n".join(f"{operation} — {check}:\n{found[0]}"
                                     for (operation, check), found in failures.items())
