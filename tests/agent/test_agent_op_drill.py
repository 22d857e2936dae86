"""`--fault-drill op[:SPEC]` (design §2.6, issue 44): a fault inside the computation.

Small workloads whose corrupted op is also a recorded layer (its values travel in the
document: at most 4096 elements), run with and without the drill in-process; the
drilled layer is compared with the clean one through int32 views, so "exactly that
element, exactly those bits" is checked bit for bit, and the layers after it against a
float32 recomputation from the drilled layer (torch.testing). One CLI run checks the
flag, the document's marking and the usage errors.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.agent import run_agent
from torch import nn

from numparity_agent._drill_spec import DrillSpecError, OpDrillSpec, parse_drill
from numparity_agent._inject import op_class
from numparity_agent.testing import Built, Workload, bell_tensor, init_default_, run_workload
from numparity_agent.testing import variant as get_variant

CPU = torch.device("cpu")
STRICT = get_variant("strict")


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class Small(Workload):
    """fc1 (addmm), tanh (not a leaf module: unrecorded), fc2 (addmm), output."""

    name = "test-op-drill"

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        model = TwoLayers()
        init_default_(model, self)
        model.eval()
        x = bell_tensor(self, "input.x", (4, 16))
        return Built(model=model.to(dtype=dtype, device=device), inputs={"x": x.to(dtype)})


class ReluLeaf(nn.Module):
    """One leaf: ReLU(x W^T), so the product itself is never recorded, only after ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(8, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x @ self.weight.T)


class Masking(Workload):
    name = "test-op-drill-mask"

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        model = nn.Sequential(ReluLeaf())
        init_default_(model, self)
        with torch.no_grad():
            model[0].weight.copy_(bell_tensor(self, "weight", (8, 16)))
        model.eval()
        x = bell_tensor(self, "input.x", (4, 16))
        return Built(model=model.to(dtype=dtype, device=device), inputs={"x": x.to(dtype)})


def values(result: dict[str, Any], name: str) -> np.ndarray:
    (entry,) = [t for t in result["tensors"] if t["name"] == name]
    raw = base64.b64decode(entry["values"]["data"])
    return np.frombuffer(raw, dtype="<f4").reshape(entry["shape"])


def words(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint32).reshape(-1)


@pytest.fixture(scope="module")
def clean() -> dict[str, Any]:
    return run_workload(Small(), variant=STRICT, device=CPU, repeats=1)


def drilled(spec: str, workload: Workload | None = None, repeats: int = 1) -> dict[str, Any]:
    return run_workload(workload or Small(), variant=STRICT, device=CPU, repeats=repeats,
                        fault_drill=spec)


@pytest.mark.parametrize(("spec", "bits"), [
    ("op:matmul,call=0,element=5,bit=20", [20]),
    ("op:matmul,call=0,element=30,bit=sign", [31]),
    ("op:matmul,call=0,element=7,bit=23,bits=3", [23, 24, 25]),
])
def test_exactly_the_chosen_element_and_bits_of_the_chosen_call(clean, spec, bits):
    result = drilled(spec, repeats=2)
    flip = result["drill"]
    assert (flip["kind"], flip["class"], flip["op"], flip["call"], flip["calls"]) == \
        ("op", "matmul", "aten.addmm.default", 0, 2)
    assert flip["bits"] == bits and result["repeats_agree"] is True
    # The inputs and parameters are untouched; fc1 differs in exactly one element, by
    # exactly the chosen bits.
    assert (result["input_hash"], result["param_hash"]) == (clean["input_hash"],
                                                           clean["param_hash"])
    xor = words(values(clean, "fc1")) ^ words(values(result, "fc1"))
    assert np.flatnonzero(xor).tolist() == [flip["index"]]
    assert int(xor[flip["index"]]) == sum(1 << b for b in bits)
    assert float(values(result, "fc1").reshape(-1)[flip["index"]]) == flip["after"]
    assert float(values(clean, "fc1").reshape(-1)[flip["index"]]) == flip["before"]
    # Everything after is the clean computation of the corrupted fc1 (nothing else hit).
    model = Small().build(dtype=torch.float32, device=CPU).model
    expected = model.fc2(torch.tanh(torch.from_numpy(values(result, "fc1").copy())))
    torch.testing.assert_close(torch.from_numpy(values(result, "fc2").copy()),
                               expected.detach(), rtol=0, atol=0)
    assert flip["outcome"] == "seen" and flip["first_changed"] == "fc1"


def test_the_seed_draws_the_same_position_every_time_and_another_seed_another():
    first, again = drilled("op:matmul,seed=11")["drill"], drilled("op:matmul,seed=11")["drill"]
    assert first == again
    others = {tuple((drilled(f"op:matmul,seed={s}")["drill"][k])
                    for k in ("call", "index")) for s in range(4)}
    assert len(others) > 1


def test_a_stuck_lane_corrupts_the_same_element_of_every_later_call(clean):
    result = drilled("op:matmul,call=0,element=3,bit=21,stuck")
    flip = result["drill"]
    assert flip["stuck"] is True and flip["hits"] == 2
    # fc2 is fc2(tanh(drilled fc1)) with its own element 3 flipped by the same bit.
    model = Small().build(dtype=torch.float32, device=CPU).model
    recomputed = model.fc2(torch.tanh(torch.from_numpy(values(result, "fc1").copy()))).detach()
    xor = words(recomputed.numpy()) ^ words(values(result, "fc2"))
    assert np.flatnonzero(xor).tolist() == [3] and int(xor[3]) == 1 << 21


def test_a_class_the_workload_never_runs_corrupts_nothing(clean):
    result = drilled("op:conv")
    assert result["drill"]["calls"] == 0 and "op" not in result["drill"]
    assert [t["hash"] for t in result["tensors"]] == [t["hash"] for t in clean["tensors"]]


def test_a_negative_product_flipped_before_relu_is_reported_masked_not_seen():
    workload = Masking()
    built = workload.build(dtype=torch.float32, device=CPU)
    # The oracle: the clean product, computed here; pick a negative and a positive element.
    product = (built.inputs["x"] @ built.model[0].weight.T).detach().reshape(-1)
    negative = int(torch.nonzero(product < -0.1)[0])
    positive = int(torch.nonzero(product > 0.1)[0])
    masked = drilled(f"op:matmul,call=0,element={negative},bit=20", workload)["drill"]
    assert masked["before"] < 0 and masked["after"] < 0
    assert masked["outcome"] == "masked" and "first_changed" not in masked
    # The same bit of a positive element, or the sign of the negative one, gets through.
    for element, bit in ((positive, "20"), (negative, "sign")):
        seen = drilled(f"op:matmul,call=0,element={element},bit={bit}", workload)["drill"]
        assert (seen["outcome"], seen["first_changed"]) == ("seen", "0")


def test_spec_parsing_and_op_classes():
    assert parse_drill(True) == "tensor" and parse_drill(False) is None
    spec = parse_drill("op:conv,seed=3,bit=exponent,bits=2,stuck")
    assert spec == OpDrillSpec(op_class="conv", seed=3, field="exponent", bits=2, stuck=True)
    assert parse_drill(spec.text()) == spec
    for bad in ("layer", "op:gemm", "op:matmul,bit=-1", "op:matmul,bits=0", "op:x=1"):
        with pytest.raises(DrillSpecError):
            parse_drill(bad)
    aten = torch.ops.aten
    assert [op_class(f) for f in (aten.addmm.default, aten.convolution.default,
                                  aten._softmax.default, aten.add_.Tensor, aten.relu.default,
                                  aten._scaled_dot_product_flash_attention_for_cpu.default,
                                  aten.clone.default, aten.view.default)] == \
        ["matmul", "conv", "reduction", "elementwise", "elementwise", "attention", None, None]


@pytest.fixture(scope="module")
def cli_document(tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("op-drill") / "doc.json"
    done = run_agent("run", "--workloads", "mlp", "--variants", "strict", "--repeats", "1",
                     "--fault-drill", "op:matmul,seed=5,bit=sign", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert "fault drill op:matmul,seed=5,bit=sign: bit(s) [31] of aten.addmm" in done.stderr
    return json.loads(out.read_text())


def test_the_cli_marks_the_document_as_a_drill_and_names_the_spec(cli_document):
    assert cli_document["drill"] is True and cli_document["drill_device"] == "cpu"
    assert cli_document["drill_spec"] == "op:matmul,seed=5,bit=sign"
    (result,) = cli_document["results"]
    assert result["drill"]["kind"] == "op" and result["drill"]["bits"] == [31]
    assert result["drill"]["outcome"] == "seen"


def test_a_bad_spec_is_a_usage_error():
    for command in ("run", "check"):
        server = ("--server", "http://127.0.0.1:9") if command == "check" else ()
        done = run_agent(command, *server, "--fault-drill", "op:gemm", timeout=60)
        assert done.returncode == 2, done.stderr
        assert "op:gemm" in done.stderr or "gemm" in done.stderr
