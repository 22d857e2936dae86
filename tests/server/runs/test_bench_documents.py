"""The benchmarks' generated documents are ones the server accepts: ``bench/ingest.py``'s
new environments (also ``bench/check.py``'s fleet) change the values of small tensors,
so their hash and stats must be the values' own, as the agent computes them. A small
document (one tensor per dtype, no server), not the bench's full suite."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from numparity_server.runs.service import validate_document

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def ingest() -> ModuleType:
    pytest.importorskip("torch")
    # Appended, not prepended: bench/'s scripts must not shadow anything installed.
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    import ingest

    return ingest


@pytest.fixture(scope="module")
def template(ingest: ModuleType) -> dict[str, Any]:
    import torch

    from numparity_agent.testing import build_document, capture_environment, fingerprint

    generator = torch.Generator().manual_seed(7)
    specs = [("loss", (), torch.bfloat16), ("probe", (1,), torch.float16),
             ("out", (8, 10), torch.float32), ("ref", (3, 5), torch.float64),
             ("big", (80, 80), torch.float32)]  # 6,400 elements: no values
    tensors = [{"name": name, "kind": "layer", "order": order,
                **fingerprint(torch.randn(shape, generator=generator).to(dtype))}
               for order, (name, shape, dtype) in enumerate(specs)]
    result = {"suite": "standard", "workload": "mlp", "workload_version": 1,
              "variant": "default", "device": "cpu", "status": "ok", "dtype": "float32",
              "input_hash": "a" * 64, "param_hash": "b" * 64, "repeats": 1,
              "repeats_agree": True, "wall_s": 0.01, "knobs": {}, "tensors": tensors}
    return build_document(node="seed", labels={}, environment=capture_environment(),
                          results=[result], started_at="2026-11-21T10:00:00Z",
                          finished_at="2026-11-21T10:00:01Z")


def test_the_template_and_its_new_environments_validate(ingest, template):
    validate_document(template)
    before = {t["name"]: t for t in template["results"][0]["tensors"]}
    for minute in (1, 2):
        document = ingest.as_new_environment(template, f"new-{minute}", minute)
        run = validate_document(document)  # hash and stats agree with the values
        assert run.environment.env_key != template["environment"]["env_key"]
        for tensor in document["results"][0]["tensors"]:
            old = before[tensor["name"]]
            assert tensor["hash"] != old["hash"], tensor["name"]
            assert tensor["dtype"] == old["dtype"] and tensor["shape"] == old["shape"]
            if "values" in old:
                assert tensor["values"]["data"] != old["values"]["data"]
                assert tensor["stats"]["nan"] == tensor["stats"]["inf"] == 0
            else:
                assert "values" not in tensor
