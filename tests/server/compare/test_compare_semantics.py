"""/compare judges two results of one CUDA device in CUDA's isclose arithmetic, and
results of two devices in the CPU's, as torch.testing.assert_close compares tensors on
two devices (it moves both to the CPU first), and says which (issues 28 and 42, 13).

A bfloat16 pair at the default tolerance's boundary that torch.isclose calls close on
the CPU and that CUDA's arithmetic (atol added as a float32, not rounded to bfloat16:
closeness.py) calls not close: the same two tensors are equivalent between two CPU
runs and between runs of two GPUs, and divergent between two runs of one GPU, each
verdict naming its semantics, in the API and on the compare page.
"""

from __future__ import annotations

import base64

import torch
from helpers.documents import gpu_document, run_document, tensor_hash

# float(bfloat16) values: 1.6331672e-05 against 6.198883e-06 under rtol 1.6e-2, atol 1e-5.
A, B = 1.633167266845703e-05, 6.198883056640625e-06


def bfloat16_entry(values: list[float]) -> dict:
    raw = torch.tensor(values).to(torch.bfloat16).view(torch.int16).numpy().astype("<i2")
    data = raw.tobytes()
    shape = [len(values)]
    return {"name": "output", "kind": "output", "order": 0, "dtype": "bfloat16",
            "shape": shape, "hash": tensor_hash("bfloat16", shape, data),
            "values": {"dtype": "bfloat16", "data": base64.b64encode(data).decode()}}


def runs(api, devices: str, suffix: str) -> None:
    """Runs a-SUFFIX and b-SUFFIX: on two CPUs, on one GPU (one node, twice), or on two
    GPUs (two nodes)."""
    for hours, (run_id, value) in enumerate(((f"a-{suffix}", B), (f"b-{suffix}", A))):
        if devices == "one-gpu":
            document = gpu_document(f"node-{suffix}", 2 - hours, [f"uuid-{suffix}"])
        elif devices == "two-gpus":
            document = gpu_document(f"node-{run_id}", 1, [f"uuid-{run_id}"])
        else:
            document = run_document(f"node-{run_id}", run_id=run_id)
        document["run_id"] = run_id
        document["results"] = [{**document["results"][0], "tensors": [
            bfloat16_entry([value, 1.0])]}]
        stored = api.post_run(document)
        assert stored.status_code == 201, stored.text


def test_one_gpus_results_are_judged_in_cudas_arithmetic_two_gpus_in_the_cpus(api):
    a, b = torch.tensor([B]).to(torch.bfloat16), torch.tensor([A]).to(torch.bfloat16)
    assert float(a) == B and float(b) == A
    assert bool(torch.isclose(b, a, rtol=1.6e-2, atol=1e-5))  # the CPU's verdict: close
    runs(api, "cpu", suffix="cpu")
    runs(api, "one-gpu", suffix="gpu")
    runs(api, "two-gpus", suffix="gpus")
    verdicts = {}
    for suffix in ("cpu", "gpu", "gpus"):
        answer = api.client.get("/api/v1/compare", headers=api.reader,
                                params={"run_a": f"a-{suffix}", "run_b": f"b-{suffix}"})
        assert answer.status_code == 200, answer.text
        (pair,) = answer.json()["pairs"]
        (row,) = pair["tensors"]
        assert row["basis"] == "values" and row["semantics"] == pair["semantics"]
        verdicts[suffix] = (pair["semantics"], row["verdict"])
    assert verdicts == {"cpu": ("cpu", "equivalent"), "gpu": ("cuda", "divergent"),
                        # two devices: compared as assert_close compares them, on the CPU
                        "gpus": ("cpu", "equivalent")}

    html = api.client.get("/compare?run_a=a-gpu&run_b=b-gpu", headers=api.reader).text
    assert 'data-semantics="cuda"' in html and "isclose as on CUDA" in html
    html = api.client.get("/compare?run_a=a-cpu&run_b=b-cpu", headers=api.reader).text
    assert 'data-semantics="cpu"' in html and "isclose as on the CPU" in html
