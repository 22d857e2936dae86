"""A child's first evaluation of a workload is a warm-up, never the answer (issue 44's
false alarms: on this CPU torch's first `train` in about 1 % of fresh processes differs
in the last bits from every later one, and a `check` that recorded it called an honest
node a no-go).

The first-evaluation effect is modelled by a workload whose first run in a process adds
one ULP to its output; the steady answer is computed here independently.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from numparity_agent.testing import Built, Workload, bell_tensor, run_workload, tensor_hash
from numparity_agent.testing import variant as get_variant

CPU = torch.device("cpu")


class FirstDiffers(Workload):
    """y = 2x, except that the first evaluation in the process is one ULP up."""

    name = "test-first-differs"
    evaluations = 0

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        return Built(model=nn.Identity(), inputs={"x": bell_tensor(self, "x", (16,))})

    def run(self, built: Built, recorder: Any) -> None:
        y = built.inputs["x"] * 2
        if type(self).evaluations == 0:
            y = torch.nextafter(y, torch.full_like(y, torch.inf))
        type(self).evaluations += 1
        recorder.record("output", "output", y)


class FirstIsTheAnswer(FirstDiffers):
    name = "test-first-is-the-answer"
    warmup = False


def steady(workload: Workload) -> str:
    return tensor_hash(workload.build(dtype=torch.float32, device=CPU).inputs["x"] * 2)


def test_the_recorded_answer_is_the_steady_one_not_the_processs_first() -> None:
    FirstDiffers.evaluations = 0
    result = run_workload(FirstDiffers(), variant=get_variant("strict"), device=CPU,
                          repeats=2)
    (output,) = result["tensors"]
    assert output["hash"] == steady(FirstDiffers())
    assert result["repeats_agree"] is True and len(result["wall_s_repeats"]) == 2
    assert FirstDiffers.evaluations == 3  # the warm-up, then the two repeats


def test_a_workload_without_warmup_records_its_first_and_its_repeats_disagree() -> None:
    FirstIsTheAnswer.evaluations = 0
    result = run_workload(FirstIsTheAnswer(), variant=get_variant("strict"), device=CPU,
                          repeats=2)
    (output,) = result["tensors"]
    assert output["hash"] != steady(FirstIsTheAnswer())
    assert result["repeats_agree"] is False and FirstIsTheAnswer.evaluations == 2
