"""`run --fault-drill` (design §2.6): one flipped bit in one activation of `strict`.

Real cnn and mlp runs through the CLI, with and without the drill, compared tensor by
tensor; the flip the document reports is checked bit by bit with numpy and, for mlp,
replayed on an independent float32 forward that must give the drill's output.
"""

import base64
import json

import numpy as np
import pytest
import torch
from helpers.agent import run_agent
from torch import nn

from numparity_agent.testing import (
    Built,
    Workload,
    bell_tensor,
    init_default_,
    load_workload,
    run_workload,
    variant,
)

CPU = torch.device("cpu")
ARGS = ("--workloads", "cnn", "mlp", "--variants", "strict", "default", "--repeats", "2")
# Fields that are measurements of this run, not of the numbers.
TIMINGS = {"wall_s", "wall_s_repeats", "timeline"}


def run_document(tmp_path_factory, *flags: str) -> dict:
    out = tmp_path_factory.mktemp("drill") / "doc.json"
    proc = run_agent("run", *ARGS, *flags, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict:
    return run_document(tmp_path_factory)


@pytest.fixture(scope="module")
def drill(tmp_path_factory) -> dict:
    return run_document(tmp_path_factory, "--fault-drill")


def result(document: dict, workload: str, variant: str) -> dict:
    (found,) = [
        r for r in document["results"] if r["workload"] == workload and r["variant"] == variant
    ]
    return found


def values(entry: dict) -> np.ndarray:
    data = base64.b64decode(entry["values"]["data"])
    return np.frombuffer(data, dtype="<f4").reshape(entry["shape"])


def test_the_document_is_marked_as_a_drill(clean, drill):
    assert drill["drill"] is True and drill["drill_device"] == "cpu"
    assert clean["drill"] is False and "drill_device" not in clean


@pytest.mark.parametrize("workload", ["cnn", "mlp"])
def test_the_flip_is_one_bit_of_the_largest_element_of_the_middle_layer(clean, drill, workload):
    strict = result(drill, workload, "strict")
    flip = strict["drill"]
    assert set(flip) == {"layer", "index", "bit", "before", "after"}
    layers = [t["name"] for t in strict["tensors"] if t["kind"] == "layer"]
    assert flip["layer"] == layers[len(layers) // 2]  # cnn: pool2, mlp: fc2
    # The element was the largest of the clean activation (its float64 stats).
    (clean_entry,) = [
        t for t in result(clean, workload, "strict")["tensors"] if t["name"] == flip["layer"]
    ]
    assert 0 <= flip["index"] < clean_entry["stats"]["count"]
    assert clean_entry["stats"]["max"] == flip["before"]
    # JSON floats carry float32 values exactly: reinterpret them and compare the bits.
    before = np.array(flip["before"], dtype=np.float32)
    after = np.array(flip["after"], dtype=np.float32)
    assert float(before) == flip["before"] and float(after) == flip["after"]
    assert flip["bit"] == 20
    assert int(before.view(np.uint32) ^ after.view(np.uint32)) == 1 << 20
    assert before > 0 and after > 0


@pytest.mark.parametrize("workload", ["cnn", "mlp"])
def test_the_corrupted_layer_is_the_first_to_differ_and_everything_after_differs(
    clean, drill, workload
):
    before, after = result(clean, workload, "strict"), result(drill, workload, "strict")
    assert after["input_hash"] == before["input_hash"]
    assert after["param_hash"] == before["param_hash"]
    names = [t["name"] for t in before["tensors"]]
    assert [t["name"] for t in after["tensors"]] == names
    pairs = zip(before["tensors"], after["tensors"], strict=True)
    differs = [a["hash"] != b["hash"] for a, b in pairs]
    first = differs.index(True)
    assert names[first] == after["drill"]["layer"]
    assert all(differs[first:]), [n for n, d in zip(names, differs, strict=True) if not d]
    assert names[-1] == "output" and differs[-1]
    # The layers before it are the same fingerprints to the last byte.
    assert after["tensors"][:first] == before["tensors"][:first]


@pytest.mark.parametrize("workload", ["cnn", "mlp"])
def test_repeats_of_the_drill_agree(drill, workload):
    strict = result(drill, workload, "strict")
    assert strict["repeats"] == 2
    assert strict["repeats_agree"] is True and "repeats_differ" not in strict


def test_everything_else_is_what_a_run_without_the_flag_gives(clean, drill):
    assert [(r["workload"], r["variant"]) for r in drill["results"]] == [
        (r["workload"], r["variant"]) for r in clean["results"]
    ]
    assert drill["environment"]["env_key"] == clean["environment"]["env_key"]
    for before, after in zip(clean["results"], drill["results"], strict=True):
        if after["variant"] != "strict":
            assert "drill" not in after
            strip = TIMINGS
        else:
            strip = TIMINGS | {"drill", "tensors"}
        assert {k: v for k, v in after.items() if k not in strip} == {
            k: v for k, v in before.items() if k not in strip
        }


def test_the_drill_output_is_the_reported_flip_carried_through_mlp(clean, drill):
    """An independent float32 forward of mlp, with the reported bit flipped in fc2,
    gives the drill's output; only the batch row holding the flip changes."""
    flip = result(drill, "mlp", "strict")["drill"]
    model = load_workload("mlp").build(dtype=torch.float32, device=CPU)
    seq, x = model.model, model.inputs["x"]
    with torch.no_grad():
        fc2 = seq.fc2(seq.act1(seq.fc1(x)))
        assert fc2.flatten()[flip["index"]].item() == pytest.approx(flip["before"], rel=1e-6)
        assert fc2.flatten()[flip["index"]].item() == pytest.approx(fc2.max().item(), rel=1e-6)
        clean_out = seq.fc3(seq.act2(fc2))
        corrupted = fc2.clone()
        corrupted.view(-1)[flip["index"]] = flip["after"]
        drill_out = seq.fc3(seq.act2(corrupted))

    def output(document: dict) -> torch.Tensor:
        (entry,) = [
            t for t in result(document, "mlp", "strict")["tensors"] if t["name"] == "output"
        ]
        return torch.from_numpy(values(entry).copy())

    torch.testing.assert_close(output(clean), clean_out)
    torch.testing.assert_close(output(drill), drill_out)
    row = flip["index"] // fc2.shape[1]
    changed = (output(drill) != output(clean)).any(dim=1)
    assert changed.nonzero().flatten().tolist() == [row]
    # The change is far beyond float32 rounding: an audit cannot mistake it for noise.
    assert (output(drill)[row] - output(clean)[row]).abs().max() > 1e-4


def test_fault_drill_without_strict_is_a_usage_error():
    proc = run_agent("run", "--fault-drill", "--workloads", "mlp", "--variants", "default")
    assert proc.returncode == 2
    assert "--fault-drill corrupts the strict variant" in proc.stderr


# In-process: the workloads the CLI runs above do not cover.

STRICT = variant("strict")


def without_timings(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in TIMINGS}


def hashes(result: dict) -> dict[str, str]:
    return {t["name"]: t["hash"] for t in result["tensors"]}


def test_train_is_corrupted_in_its_first_forward_only():
    load = load_workload
    before = run_workload(load("train"), variant=STRICT, device=CPU, repeats=1)
    after = run_workload(load("train"), variant=STRICT, device=CPU, repeats=2, fault_drill=True)
    # The layers of step 0 are fc1, act1, fc2: act1 is the middle one.
    assert after["drill"]["layer"] == "act1" and after["repeats_agree"] is True
    old, new = hashes(before), hashes(after)
    assert old["fc1"] == new["fc1"]
    # The flipped activation reaches the loss, the gradients and the trained weights.
    changed = [name for name in old if old[name] != new[name]]
    assert changed == [name for name in old if name != "fc1"]


def test_probes_record_no_layers_and_run_untouched():
    load = load_workload
    before = run_workload(load("probes"), variant=STRICT, device=CPU, repeats=1)
    after = run_workload(load("probes"), variant=STRICT, device=CPU, repeats=1, fault_drill=True)
    assert "drill" not in after
    assert without_timings(after) == without_timings(before)


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sequence, _state = self.lstm(self.embed(x))
        return self.head(sequence)


class RecurrentWorkload(Workload):
    """A recurrent layer in the middle: the drill corrupts its output sequence."""

    name = "test-recurrent"

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        model = Recurrent()
        init_default_(model, self)
        model.eval()
        x = bell_tensor(self, "input.x", (2, 5, 4))
        return Built(model=model.to(dtype=dtype, device=device), inputs={"x": x.to(dtype)})


def test_a_recurrent_layer_has_its_output_sequence_corrupted_not_its_state():
    workload = RecurrentWorkload()
    before = run_workload(workload, variant=STRICT, device=CPU, repeats=1)
    after = run_workload(workload, variant=STRICT, device=CPU, repeats=2, fault_drill=True)
    # Corruptible calls: embed, lstm (its output sequence), head: lstm is the middle.
    assert after["drill"]["layer"] == "lstm.output" and after["repeats_agree"] is True
    old, new = hashes(before), hashes(after)
    assert [name for name in old if old[name] != new[name]] == ["lstm.output", "head", "output"]
