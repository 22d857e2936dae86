"""`doctor`'s data pipeline check (design §2.6): whether this node's DataLoader needs the
seeds' recipe, measured here with real workers (`_workloads._pipeline`), not stated.

The built-in `data` pipeline by default, or a lab's DataLoader factory
(`doctor --pipeline module:factory`). The answer is a status and a sentence:

- `ok`: nothing breaks without the recipe (the loader needs none of it);
- `fact`: without the recipe the order or the batches change between runs, or workers
  repeat each other's augmentations, and with it they do not: code must use it;
- `warn`: even with the recipe something breaks: something on this node, or in the
  lab's pipeline, defeats it (a generator the recipe cannot reach, start-up code that
  reseeds).
"""

from __future__ import annotations

import functools
from typing import Any

# torch's default CPU seed before releases that seed the default generator from the
# operating system at start (c10's default_rng_seed_val).
TORCH_FIXED_DEFAULT_SEED = 67280421310721
HOLDS = ("order_reproducible", "runs_agree", "streams_distinct")
RECIPE_CODE = (
    "def seed_worker(_): s = torch.initial_seed() % 2**32; numpy.random.seed(s); "
    "random.seed(s)  -- and reseed there any generator the dataset holds "
    "(torch.utils.data.get_worker_info().dataset); seed random, numpy and torch once at "
    "start; then DataLoader(..., worker_init_fn=seed_worker, "
    "generator=torch.Generator().manual_seed(0))")


def _duplicates(check: dict[str, Any]) -> str:
    return "; ".join(f"{d['augmentation']} repeats in workers "
                     f"{', '.join(map(str, d['workers']))} (num_workers={d['num_workers']})"
                     for d in check.get("duplicates", []))


def _broken(checks: dict[str, Any], configuration: str, torch_seed: str = "") -> list[str]:
    """What breaks in a configuration, in words (workers_agree apart)."""
    found = []
    order = checks[f"{configuration}_order_reproducible"]
    if not order["equal"]:
        found.append("the shuffle order changes between runs" + (
            f" (it follows torch's global generator, which {torch_seed})" if torch_seed
            else ""))
    runs = checks[f"{configuration}_runs_agree"]
    if not runs["equal"]:
        found.append(f"the batches change between runs ({', '.join(runs['augmentations'])})")
    streams = checks[f"{configuration}_streams_distinct"]
    if not streams["equal"]:
        found.append(_duplicates(streams))
    return found


def verdict(checks: dict[str, Any], data: dict[str, Any], *, without: str,
            torch_seed: str) -> tuple[str, str]:
    """(status, message) of one pipeline's measured checks."""
    counts = ", ".join(map(str, data["num_workers"]))
    head = f"measured here with num_workers {counts}"
    recipe, plain = _broken(checks, "recipe"), _broken(checks, without, torch_seed)
    workers = checks["recipe_workers_agree"]
    apart = ("" if workers["equal"] else
             "; even with it the batches differ between worker counts (an augmentation "
             "depends on which worker's stream draws it: "
             f"{', '.join(next(iter(workers['differing'].values()), []))})")
    label = "as built" if without == "own" else "without the recipe"
    if recipe:
        return "warn", (f"{head}: even with the seeds' recipe {'; '.join(recipe)} "
                        f"({label}: {'; '.join(plain) or 'nothing breaks'})")
    if not plain:
        return "ok", (f"{head}: {label} the order and batches are the same in every run and "
                      f"no worker repeats another's augmentations{apart}")
    return "fact", (f"{head}: {label} {'; '.join(plain)}; with the seeds' recipe "
                    f"the order and batches are the same in every run and no worker repeats "
                    f"another's augmentations{apart}")


def torch_seed_words() -> str:
    """How torch seeds its default generator in a fresh process here, read from this one
    (the doctor's, where nothing of numparity seeds it)."""
    import torch

    if torch.initial_seed() == TORCH_FIXED_DEFAULT_SEED:
        return ("this torch starts from the same seed in every process: the order changes "
                "when other code draws from it first")
    return "this torch seeds from the operating system in every process"


@functools.lru_cache(maxsize=8)
def measure(pipeline: str | None = None) -> tuple[str, str]:
    """(status, message): the built-in pipeline, or the lab's `module:factory` (once a
    process: it is the node's answer, and a measurement starts worker processes)."""
    import torch

    from numparity_agent import _workloads
    from numparity_agent._workloads._base import Recorder
    from numparity_agent._workloads._pipeline import PipelineWorkload

    torch_seed = torch_seed_words()  # before the measurement seeds anything
    workload = _workloads.load(pipeline or "data")
    if not isinstance(workload, PipelineWorkload):
        raise ValueError(f"{pipeline} returns no DataLoader (nor a dataset and settings)")
    recorder = Recorder()
    workload.run(workload.build(dtype=torch.float32, device=torch.device("cpu")), recorder)
    without = "own" if pipeline else "no_recipe"
    return verdict(recorder.fields["checks"], recorder.fields["data"], without=without,
                   torch_seed=torch_seed)
