"""The data pipeline table (design §3.3.12) from plain values: the checks the agent's `data`
workload and a lab's DataLoader factories report, per environment."""

from __future__ import annotations

from numparity_server.analysis.data_pipeline import (
    Reported,
    data_pipelines,
    is_pipeline_check,
    split_check,
)
from numparity_server.analysis.numerics import Reported as NumericsReported
from numparity_server.analysis.numerics import numerics


def holds(**details):
    return {"equal": True, "max_ulp": None, "max_rel": None, "op": None, **details}


def breaks(op, **details):
    return {"equal": False, "max_ulp": None, "max_rel": None, "op": op, **details}


JITTER = {"augmentation": "jitter", "workers": [0, 1], "num_workers": 2}
BUILTIN = {
    "recipe_order_reproducible": holds(num_workers=[]),
    "recipe_runs_agree": holds(num_workers=[], augmentations=[]),
    "recipe_workers_agree": breaks("crop", num_workers=[0, 2],
                                   differing={"2": ["crop", "noise"]}, order_equal=True),
    "recipe_streams_distinct": holds(duplicates=[], random=["crop", "noise", "jitter"]),
    "no_recipe_order_reproducible": breaks("order", num_workers=[0, 2]),
    "no_recipe_runs_agree": breaks("crop", num_workers=[0, 2],
                                   augmentations=["crop", "noise", "jitter"]),
    "no_recipe_workers_agree": breaks("crop", num_workers=[0, 2], differing={"2": ["crop"]}),
    "no_recipe_streams_distinct": breaks("jitter", duplicates=[JITTER],
                                         random=["crop", "noise", "jitter"]),
}


def test_pipeline_check_names_are_configuration_and_check():
    assert split_check("no_recipe_streams_distinct") == ("no_recipe", "streams_distinct")
    assert split_check("recipe_runs_agree") == ("recipe", "runs_agree")
    assert split_check("own_workers_agree") == ("own", "workers_agree")
    for other in ("batch_invariant", "recipe_batch_invariant", "mine_runs_agree", "recipe_"):
        assert not is_pipeline_check(other)


def test_the_recipe_holds_and_what_breaks_without_it_is_named():
    (row,) = data_pipelines([Reported(7, "standard", "default", "data", BUILTIN, 3)])
    assert (row.environment, row.workload, row.devices) == (7, "data", 3)
    assert row.recipe_holds is True and row.without == "no_recipe"
    assert row.without_holds is False and row.needs_recipe is True
    assert row.workers_agree is False
    without = [b for b in row.breaks if b.configuration == "no_recipe"]
    assert [b.check for b in without] == ["order_reproducible", "runs_agree", "workers_agree",
                                          "streams_distinct"]
    streams = without[-1]
    assert streams.op == "jitter"
    assert streams.words == "jitter repeats in workers 0, 1 (num_workers=2)"
    assert without[0].words == "the order changes between runs (num_workers 0, 2)"
    assert without[1].words == ("the batches change between runs (num_workers 0, 2): crop, "
                                "noise, jitter")
    (recipe,) = [b for b in row.breaks if b.configuration == "recipe"]
    assert recipe.check == "workers_agree" and recipe.augmentations == ("crop", "noise")


def test_a_device_that_breaks_the_recipe_breaks_its_environment():
    broken = {**BUILTIN, "recipe_streams_distinct": breaks(
        "jitter", duplicates=[{**JITTER, "workers": [0, 1, 2, 3], "num_workers": 4}])}
    (row,) = data_pipelines([Reported(1, "standard", "default", "data", BUILTIN, 2),
                             Reported(1, "standard", "default", "data", broken, 1)])
    assert row.devices == 3  # the environment's devices, whichever answer they hold
    assert row.recipe_holds is False and row.needs_recipe is False
    (recipe,) = [b for b in row.breaks if b.configuration == "recipe"
                 and b.check == "streams_distinct"]
    assert recipe.devices == 1 and recipe.duplicates[0].workers == (0, 1, 2, 3)
    # The same break on both outcomes is one break of all their devices.
    (order,) = [b for b in row.breaks if b.check == "order_reproducible"]
    assert order.devices == 3


def test_a_labs_own_loader_is_the_configuration_without_the_recipe():
    own = {name.replace("no_recipe_", "own_"): check for name, check in BUILTIN.items()}
    rows = data_pipelines([Reported(1, "standard", "default", "lab.data:loader", own, 1),
                           Reported(1, "standard", "default", "data", BUILTIN, 1),
                           Reported(2, "standard", "default", "mlp", {}, 1)])
    assert [(row.workload, row.without) for row in rows] == [("data", "no_recipe"),
                                                             ("lab.data:loader", "own")]


def test_a_loader_that_reproduces_without_the_recipe_does_not_need_it():
    fine = {**BUILTIN, **{name: holds() for name in BUILTIN if name.startswith("no_recipe")}}
    (row,) = data_pipelines([Reported(1, "standard", "default", "data", fine, 1)])
    assert row.without_holds is True and row.needs_recipe is False


def test_numerics_leave_the_pipelines_checks_to_their_table():
    decoder = {"batch_invariant": breaks("blocks.0.attn.qkv")}
    rows = numerics([NumericsReported(1, "cpu", "standard", "default", "data", BUILTIN, 1),
                     NumericsReported(1, "cpu", "standard", "default", "decoder", decoder, 1)])
    (row,) = rows
    assert [b.check for b in row.breaks] == ["batch_invariant"]
    assert numerics([NumericsReported(1, "cpu", "standard", "default", "data", BUILTIN, 1)]) \
        == []
