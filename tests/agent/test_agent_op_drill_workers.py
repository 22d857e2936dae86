"""`--fault-drill op:SPEC` in DataLoader workers (design §2.6, issue 44): `data`'s
augmentations run in its loader's worker processes, and the drill reaches them.

Each item of `data` computes, in the worker that fetches it: brightness = rand·0.5 +
0.75, then image = crop·brightness + noise + jitter: five elementwise ops, the last the
image's `+ jitter`. One epoch of the recipe's loader with two workers is read clean and
drilled (the pipeline's own `read_epoch`, in this process); the drilled batches are
checked bit for bit against the clean ones and against a numpy recomputation of each
image from the batch's own crop, brightness, noise and jitter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from numparity_agent._drill_spec import OpDrillSpec
from numparity_agent._inject import OpDrill, injecting, resolve
from numparity_agent._runner import op_census
from numparity_agent._workloads._pipeline import read_epoch
from numparity_agent.testing import load_workload, run_workload
from numparity_agent.testing import variant as get_variant

CPU = torch.device("cpu")
STRICT = get_variant("strict")
OPS_PER_ITEM = 5
BATCHES = 6
LEAVES = ("crop", "brightness", "noise", "jitter", "image")


def epoch(drill: OpDrill, workers: tuple[int, ...] = (2,)
          ) -> tuple[Any, list[dict[str, np.ndarray]]]:
    """Epochs of the recipe's loader under `drill`, one per worker count (the recipe's
    start before each): the last epoch and its batches' leaves by name."""
    workload = load_workload("data")
    built = workload.build(dtype=torch.float32, device=CPU)
    (recipe,) = [c for c in workload.configurations(built) if c.name == "recipe"]
    assert recipe.start is not None
    with injecting(drill):
        for count in workers:
            recipe.start()
            read = read_epoch(recipe.make(), count, limit=BATCHES, keep=True)
    batches = [dict(zip(names, (t.numpy() for t in tensors), strict=True))
               for names, tensors in zip(read.names, read.tensors, strict=True)]
    return read, batches


def recomputed(batch: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    """Each item's image from its own leaves, in numpy float32 (the same three
    correctly rounded operations)."""
    out = []
    for i, (top, left) in enumerate(batch["crop"]):
        crop = images[batch["index"][i], :, top:top + 8, left:left + 8]
        out.append(crop * batch["brightness"][i] + batch["noise"][i] + batch["jitter"][i])
    return np.stack(out).astype(np.float32)


@pytest.fixture(scope="module")
def clean() -> tuple[Any, list[dict[str, np.ndarray]], OpDrill]:
    census = OpDrill(OpDrillSpec(op_class="elementwise"))
    read, batches = epoch(census)
    return read, batches, census


def test_a_worker_s_op_is_corrupted_exactly_and_nothing_else(clean):
    clean_read, clean_batches, census = clean
    calls = census.calls
    # The epoch is the drill's first site; every elementwise op ran in a worker.
    assert {(c.site, c.member) for c in calls} == {(0, 0), (0, 1)}
    assert len(calls) == BATCHES * 8 * OPS_PER_ITEM
    # Worker 1 fetches batches 1, 3, 5; its item k's ops are its calls 5k .. 5k+4. The
    # `+ jitter` of its third item: batch 1, item 2.
    (call,) = [i for i, c in enumerate(calls) if (c.member, c.local) == (1, 2 * 5 + 4)]
    spec = OpDrillSpec(op_class="elementwise", call=call, element=37, bit=21)
    injection = resolve(spec, calls)
    assert injection is not None and (injection.member, injection.local) == (1, 14)
    drill = OpDrill(spec, injection)
    read, batches = epoch(drill)
    flip = drill.flipped
    assert flip is not None
    assert (flip["worker"], flip["worker_call"], flip["call"], flip["op"], flip["index"]) == \
        (1, 14, call, "aten.add.Tensor", 37)
    assert read.order == clean_read.order and read.workers == clean_read.workers
    for number, (got, want) in enumerate(zip(batches, clean_batches, strict=True)):
        for leaf in LEAVES:
            xor = got[leaf].view(np.uint8) ^ want[leaf].view(np.uint8)
            if (number, leaf) != (1, "image"):
                assert not xor.any(), (number, leaf)
        xor = got["image"].reshape(-1).view(np.uint32) ^ want["image"].reshape(-1).view(np.uint32)
        if number == 1:
            # Item 2's element 37 of its 8x8 image: flat 2*64 + 37.
            assert np.flatnonzero(xor).tolist() == [2 * 64 + 37]
            assert int(xor[2 * 64 + 37]) == 1 << 21
            assert float(want["image"].reshape(-1)[2 * 64 + 37]) == flip["before"]
            assert float(got["image"].reshape(-1)[2 * 64 + 37]) == flip["after"]


def test_the_clean_images_are_their_leaves_recomputed(clean):
    # The oracle the first test leans on: every clean image is crop·brightness + noise +
    # jitter of its own leaves, in numpy.
    _read, batches, _census = clean
    images = load_workload("data").build(dtype=torch.float32, device=CPU).inputs["images"]
    for batch, order in zip(batches, _read.order, strict=True):
        with_index = {**batch, "index": order}
        assert np.array_equal(recomputed(with_index, images.numpy()).view(np.uint32),
                              batch["image"].view(np.uint32))


def test_through_run_workload_a_worker_fault_is_reported_with_its_worker():
    workload = load_workload("data")
    spec = OpDrillSpec(op_class="elementwise")
    calls, _clean = op_census(workload, spec, variant=STRICT, dtype=torch.float32, device=CPU)
    # The first call of worker 0 in the first epoch with workers: the recipe's run 1,
    # whose batches are recorded when its two runs agree.
    (call,) = [i for i, c in enumerate(calls) if (c.site, c.member, c.local) == (0, 0, 4)]
    result = run_workload(workload, variant=STRICT, device=CPU, repeats=1,
                          fault_drill=f"op:elementwise,call={call},element=3,bit=sign")
    flip = result["drill"]
    assert (flip["worker"], flip["worker_call"], flip["call"]) == (0, 4, call)
    assert flip["before"] == -flip["after"]
    # Run 1 no longer agrees with run 2: the recipe's batches are no longer recorded,
    # which the comparison sees.
    assert result["checks"]["recipe_runs_agree"]["equal"] is False
    assert result["data"]["recorded"] == []
    assert flip["outcome"] == "seen" and flip["first_changed"] == "<tensor list>"


def test_a_stuck_lane_of_this_process_stays_out_of_the_workers_it_forks(clean):
    _read, clean_batches, _census = clean
    # Stuck from the first op of an epoch read here (no workers): all 240 of this
    # process's ops hit, none of the forked workers' (they inherit this process's modes,
    # which they drop).
    census = OpDrill(OpDrillSpec(op_class="elementwise"))
    epoch(census, (0, 2))
    assert sum(c.site is None for c in census.calls) == BATCHES * 8 * OPS_PER_ITEM
    spec = OpDrillSpec(op_class="elementwise", call=0, element=0, bit=12, stuck=True)
    drill = OpDrill(spec, resolve(spec, census.calls))
    _read2, batches = epoch(drill, (0, 2))
    assert drill.flipped is not None and "worker" not in drill.flipped
    assert drill.hits == BATCHES * 8 * OPS_PER_ITEM
    for got, want in zip(batches, clean_batches, strict=True):
        for leaf in LEAVES:
            assert np.array_equal(got[leaf].view(np.uint8), want[leaf].view(np.uint8)), leaf
