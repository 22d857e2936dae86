"""The data pipeline workloads in-process (design §2.2): the built-in `data` and a lab's
DataLoader factory, measured with real DataLoader worker processes.

The oracles are plain PyTorch: loaders written out here as a lab would write them
(nothing of `_pipeline`), and fresh interpreters for what "another run" means."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info

from numparity_agent import _workloads
from numparity_agent._workloads import _pipeline, _pipeline_checks, _user_data
from numparity_agent._workloads._base import Recorder
from numparity_agent._workloads.data import AugmentedImages, Data
from numparity_agent.testing import run_workload, tensor_hash, variant

CPU = torch.device("cpu")


def measured(workload, monkeypatch=None, counts=None):
    """(checks, data field, {tensor name: hash}) of one run of `workload`."""
    if counts is not None:
        monkeypatch.setattr(_pipeline, "worker_counts", lambda: counts)
    recorder = Recorder()
    workload.run(workload.build(dtype=torch.float32, device=CPU), recorder)
    fields = recorder.fields
    return fields["checks"], fields["data"], {n: tensor_hash(t) for n, _, t in recorder.tensors}


@pytest.fixture(scope="module")
def builtin():
    return measured(Data())


def test_builtin_recipe_holds_and_without_it_the_held_generator_repeats(builtin):
    checks, data, _tensors = builtin
    assert data["num_workers"] == list(_pipeline.worker_counts())
    for name in ("order_reproducible", "runs_agree", "streams_distinct"):
        assert checks[f"recipe_{name}"]["equal"] is True, (name, checks[f"recipe_{name}"])
    # Without the recipe: the order follows torch's global generator, and the numpy
    # Generator the dataset made in __init__ is copied into every worker alike; the
    # global generators are seeded per worker by the DataLoader itself (torch >= 1.9).
    assert checks["no_recipe_order_reproducible"] == {
        **checks["no_recipe_order_reproducible"], "equal": False, "op": "order"}
    streams = checks["no_recipe_streams_distinct"]
    assert streams["equal"] is False and streams["op"] == "jitter"
    assert {"augmentation": "jitter", "workers": [0, 1], "num_workers": 2} in streams["duplicates"]
    assert {d["augmentation"] for d in streams["duplicates"]} == {"jitter"}
    assert set(streams["random"]) == {"crop", "brightness", "noise", "jitter", "image"}
    assert checks["no_recipe_runs_agree"]["equal"] is False
    # Even with the recipe, an augmentation depends on which worker's stream draws it.
    workers = checks["recipe_workers_agree"]
    assert workers["equal"] is False and workers["order_equal"] is True
    assert data["recorded"] == ["recipe"]


def test_builtin_duplicates_are_what_a_plain_dataloader_gives():
    """The oracle: a DataLoader written out as a lab does, workers reporting their ids."""

    class Tagged(AugmentedImages):
        def __getitem__(self, index):
            return {**super().__getitem__(index), "worker": torch.tensor(get_worker_info().id)}

    images = Data().build(dtype=torch.float32, device=CPU).inputs["images"]
    loader = DataLoader(Tagged(images, None), batch_size=8, shuffle=True, num_workers=2,
                        multiprocessing_context="fork")
    first = {}
    for batch in loader:
        first.setdefault(int(batch["worker"][0]), batch)
    assert torch.equal(first[0]["jitter"], first[1]["jitter"])  # the held generator
    for leaf in ("noise", "brightness"):  # torch seeds the global ones per worker
        assert not torch.equal(first[0][leaf], first[1][leaf])


FRESH_RUN = textwrap.dedent("""
    import json, random
    import numpy as np, torch
    from torch.utils.data import DataLoader, get_worker_info
    from numparity_agent._workloads.data import AugmentedImages, Data
    images = Data().build(dtype=torch.float32, device=torch.device("cpu")).inputs["images"]

    def seed_worker(worker_id):
        seed = torch.initial_seed() % 2**32
        np.random.seed(seed); random.seed(seed)
        get_worker_info().dataset.reseed(seed)

    def epoch(recipe, workers):
        if recipe:
            random.seed(0); np.random.seed(0); torch.manual_seed(0)
        loader = DataLoader(AugmentedImages(images, 0 if recipe else None), batch_size=8,
                            shuffle=True, num_workers=workers,
                            multiprocessing_context="fork" if workers else None,
                            worker_init_fn=seed_worker if recipe else None,
                            generator=torch.Generator().manual_seed(0) if recipe else None)
        return [{k: v.numpy().tobytes().hex() for k, v in batch.items()} for batch in loader]

    # Without the recipe first: what a fresh process gives before anything draws.
    print(json.dumps({"initial_seed": torch.initial_seed(), "no_recipe": epoch(False, 2),
                      "recipe.w2": epoch(True, 2), "recipe.w0": epoch(True, 0)}))
""")


def fresh_run():
    """The recipe's loader and the plain one, as a lab's script runs them."""
    done = subprocess.run([sys.executable, "-c", FRESH_RUN], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_two_fresh_processes_agree_with_the_checks(builtin):
    """What "another run" means, with real fresh interpreters: the recipe's batches are
    the same bytes, and what the workload records is exactly those bytes; without the
    recipe two processes differ (the dataset's generator comes from entropy), and so does
    the order wherever torch seeds itself from entropy at start."""
    checks, _data, tensors = builtin
    runs = [fresh_run(), fresh_run()]
    for key in ("recipe.w2", "recipe.w0"):
        assert runs[0][key] == runs[1][key]
        for batch, leaves in enumerate(runs[0][key]):
            image = np.frombuffer(bytes.fromhex(leaves["image"]), dtype=np.float32)
            name = f"{key}.batch{batch}.image"
            assert tensors[name] == tensor_hash(torch.from_numpy(image.reshape(-1, 1, 8, 8).copy()))
    assert runs[0]["no_recipe"] != runs[1]["no_recipe"]
    assert checks["no_recipe_runs_agree"]["equal"] is False
    if runs[0]["initial_seed"] != runs[1]["initial_seed"]:
        # This torch seeds its default generator from entropy: the order changes too.
        crops = [[leaves["crop"] for leaves in run["no_recipe"]] for run in runs]
        assert crops[0] != crops[1]
        assert checks["no_recipe_order_reproducible"]["equal"] is False


def test_four_workers_name_all_four(monkeypatch):
    checks, data, tensors = measured(Data(), monkeypatch, counts=(0, 2, 4))
    assert data["num_workers"] == [0, 2, 4]
    duplicates = checks["no_recipe_streams_distinct"]["duplicates"]
    assert {"augmentation": "jitter", "workers": [0, 1, 2, 3], "num_workers": 4} in duplicates
    assert checks["recipe_streams_distinct"]["equal"] is True
    assert checks["recipe_workers_agree"]["num_workers"] == [0, 2, 4]
    # Only the worker counts every node runs are fingerprinted.
    assert not any(".w4." in name for name in tensors)


def epoch(*batches):
    """An Epoch of batches given as {leaf: hash}, in one worker (0)."""
    return _pipeline_checks.Epoch(order=[[i] for i in range(len(batches))],
                           workers=[0] * len(batches), names=[list(b) for b in batches],
                           hashes=[list(b.values()) for b in batches])


def test_a_checks_details_do_not_depend_on_which_batch_differs_first():
    """Two nodes (or runs) with the same verdicts must report the same check, or they
    hold two outcomes: leaves are listed in the batch's order, not by discovery."""
    first = epoch({"crop": "a", "noise": "b"}, {"crop": "c", "noise": "d"})
    crop_late = epoch({"crop": "a", "noise": "x"}, {"crop": "y", "noise": "z"})
    noise_late = epoch({"crop": "x", "noise": "b"}, {"crop": "y", "noise": "z"})
    found = []
    for second in (crop_late, noise_late):
        m = _pipeline_checks.Measured("no_recipe", (0,), {0: first}, {0: second}, {0: first})
        found.append(_pipeline_checks.runs_agree(m))
    assert found[0] == found[1]
    assert found[0]["op"] == "crop" and found[0]["augmentations"] == ["crop", "noise"]


def test_worker_counts_are_bounded_by_the_cpus():
    assert _pipeline.worker_counts(1) == (0, 2)
    assert _pipeline.worker_counts(2) == (0, 2)
    assert _pipeline.worker_counts(3) == (0, 2)
    assert _pipeline.worker_counts(64) == (0, 2, 4)


def test_the_process_generators_are_left_as_found():
    torch.manual_seed(11)
    np.random.seed(11)
    expected = (torch.rand(3), np.random.random(3))
    torch.manual_seed(11)
    np.random.seed(11)
    measured(Data())
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.random(3), expected[1])


def test_data_runs_once_under_default_only():
    workload = _workloads.load("data")
    assert workload.skip_reason("default") is None
    assert "default only" in workload.skip_reason("strict")
    result = run_workload(workload, variant=variant("default"), device=CPU, repeats=1)
    assert result["status"] == "ok" and result["repeats_agree"] is True
    assert result["data"]["recorded"] == ["recipe"]
    assert set(result["checks"]) == {f"{config}_{check}" for config in ("recipe", "no_recipe")
                                     for check in _pipeline_checks.CHECKS}
    assert all(t["kind"] == "output" for t in result["tensors"])
    assert result["tensors"][0]["name"] == "recipe.order"


# ---- a lab's own pipeline ------------------------------------------------------------------


def test_a_labs_worker_init_fn_that_seeds_alike_is_named():
    checks, data, tensors = measured(_workloads.load("agent_test_data_factories:duplicating"))
    own = checks["own_streams_distinct"]
    assert own["equal"] is False and own["op"] == "offset"
    assert own["random"] == ["offset", "x"]  # the label follows from the index alone
    assert {"augmentation": "offset", "workers": [0, 1], "num_workers": 2} in own["duplicates"]
    # The recipe's worker_init_fn runs first, then the lab's, which undoes it.
    assert checks["recipe_streams_distinct"]["equal"] is False
    assert checks["recipe_runs_agree"]["equal"] is True
    assert checks["own_order_reproducible"]["equal"] is False  # no generator of its own
    assert data["recorded"] == ["recipe"]
    assert all(name.startswith("recipe.") for name in tensors)


def test_a_labs_reproducible_loader_is_recorded_and_bounded():
    workload = _workloads.load("agent_test_data_factories:seeded")
    assert (workload.version, workload.batches) == (5, 3)
    checks, data, tensors = measured(workload)
    assert all(checks[f"own_{c}"]["equal"] for c in
               ("order_reproducible", "runs_agree", "streams_distinct"))
    assert data["recorded"] == ["recipe", "own"]
    own_batches = {name.split(".")[2] for name in tensors if name.startswith("own.w0.")}
    assert own_batches == {"batch0", "batch1", "batch2"}
    # The oracle: the lab's own loader, called as its script does, gives those bytes.
    from agent_test_data_factories import seeded

    first = next(iter(seeded()))
    assert tensors["own.w0.batch0.offset"] == tensor_hash(first["offset"])
    labels = [batch["label"] for _, batch in zip(range(3), seeded(), strict=False)]
    assert tensors["own.order"] == tensor_hash(torch.cat(labels))


def test_a_dataset_and_settings_are_a_pipeline_too():
    checks, data, _tensors = measured(_workloads.load("agent_test_data_factories:settings"))
    assert data["num_workers"] == list(_pipeline.worker_counts())
    assert checks["own_streams_distinct"]["equal"] is True  # torch seeds numpy per worker
    assert checks["own_order_reproducible"]["equal"] is False


def test_a_model_and_its_inputs_are_not_a_pipeline():
    from agent_test_user_factories import tiny

    assert not _user_data.is_pipeline(tiny())  # an nn.Sequential has __getitem__
    assert _user_data.is_pipeline((list(range(4)), {"batch_size": 2}))
    assert not _user_data.is_pipeline((list(range(4)), {"x": torch.zeros(2)}))


@pytest.mark.parametrize(("factory", "message"), [
    ("iterable", "an IterableDataset has no sampler to replay"),
    ("missing", "shard 0 of the lab's data is missing"),
])
def test_a_pipeline_that_cannot_be_measured_fails_with_the_reason(factory, message):
    result = run_workload(_workloads.load(f"agent_test_data_factories:{factory}"),
                          variant=variant("default"), device=CPU, repeats=1)
    assert result["status"] == "failed"
    assert message in result["error"]


def test_the_log_line_says_what_the_checks_say_not_that_one_repeat_agrees() -> None:
    # Issue 43: "train_loader ok …, repeats agree: True" while its checks said
    # own_order_reproducible: equal false. One repeat compares nothing.
    from numparity_agent._suite import _log_results

    lines: list[str] = []
    checks = {"own_order_reproducible": {"equal": False}, "own_runs_agree": {"equal": False},
              "recipe_order_reproducible": {"equal": True},
              "recipe_runs_agree": {"equal": True}}
    _log_results(lines.append, "", [
        {"workload": "train_loader", "variant": "default", "status": "ok", "wall_s": 0.5,
         "repeats": 1, "repeats_agree": True, "checks": checks}])
    (line,) = lines
    assert "repeats agree" not in line
    assert line.endswith("train_loader ok in 0.500 s, checks: 2 of 4 hold (not "
                         "own_order_reproducible, own_runs_agree)")
