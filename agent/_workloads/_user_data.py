"""A lab's own data pipeline as a workload (design §2.2): `--workloads module:factory`
whose factory returns a `DataLoader`, or `(dataset, settings)` (the DataLoader's keyword
arguments), is measured like the built-in `data` workload.

Two configurations: `own`, the loader as the factory built it (its sampler, generator,
collate function and `worker_init_fn`), and `recipe`, the same dataset and settings with
the seeds' recipe applied (every generator seeded at start, the recipe's
`worker_init_fn` before the lab's own, a seeded generator for the loader and its
sampler). The factory is called afresh for every run, as a training script builds its
pipeline, so what it does at construction (seeding, a generator of its own) is measured
too. The worker count is the agent's (`_pipeline.worker_counts`); the lab's
multiprocessing context, timeout, prefetch factor and order are kept; memory pinning is
left out (it copies, it does not change the bytes).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from numparity_agent._workloads._base import Built, Workload, from_made, import_factory
from numparity_agent._workloads._pipeline import (
    Configuration,
    LoaderSpec,
    PipelineWorkload,
    SeedWorker,
    recipe_generator,
    seed_process,
)

# The keyword arguments a (dataset, settings) factory may give.
_LOADER_SETTINGS = frozenset(inspect.signature(DataLoader.__init__).parameters) - {
    "self", "dataset"}
# How many batches of a lab's loader each run reads, unless its factory's `batches`
# attribute says otherwise, and the most it may ask for.
DEFAULT_BATCHES = 8
MAX_BATCHES = 32


def from_factory(spec: str) -> Workload:
    factory = import_factory(spec)
    made = factory()
    if is_pipeline(made):
        return LoaderWorkload(spec, factory)
    return from_made(spec, factory, made)


def is_pipeline(made: Any) -> bool:
    """A DataLoader, or (dataset, settings): a pair whose settings are DataLoader keyword
    arguments (a model and its named inputs are a pair too: an `nn.Sequential` has
    `__getitem__`, and inputs are named tensors, not settings)."""
    if isinstance(made, DataLoader):
        return True
    return (isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], Mapping)
            and not isinstance(made[0], nn.Module) and hasattr(made[0], "__getitem__")
            and set(made[1]) <= _LOADER_SETTINGS)


def loader_of(made: Any) -> DataLoader[Any]:
    """The factory's loader (`num_workers` in its settings is the agent's to choose)."""
    if isinstance(made, DataLoader):
        return made
    if not is_pipeline(made):
        raise TypeError("a data factory returns a DataLoader or (dataset, settings); this "
                        f"call returned {type(made).__name__}")
    dataset, settings = made
    return DataLoader(dataset, **{k: v for k, v in settings.items() if k != "num_workers"})


def spec_of(loader: DataLoader[Any], *, recipe: bool) -> LoaderSpec:
    """The parts of the lab's loader, with the recipe's generator and worker_init_fn
    when `recipe`."""
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError("an IterableDataset has no sampler to replay: the agent measures "
                         "map-style datasets (a DataLoader over a dataset with __getitem__)")
    batch_sampler = loader.batch_sampler
    if batch_sampler is None:
        raise ValueError("the loader does not batch (batch_size=None): give it a "
                         "batch_size or a batch_sampler")
    generator = loader.generator
    worker_init_fn = loader.worker_init_fn
    if recipe:
        generator = recipe_generator()
        # The sampler draws its permutation from the loader's generator only if it was
        # given one (shuffle=True with generator=...): hand it the recipe's.
        for sampler in (loader.sampler, getattr(batch_sampler, "sampler", None)):
            if sampler is not None and hasattr(sampler, "generator"):
                sampler.generator = generator
        worker_init_fn = SeedWorker(then=loader.worker_init_fn)
    batch_size = (loader.batch_size or getattr(batch_sampler, "batch_size", None)
                  or DEFAULT_BATCHES)
    return LoaderSpec(
        dataset=loader.dataset, batch_sampler=batch_sampler, batch_size=int(batch_size),
        collate_fn=loader.collate_fn, worker_init_fn=worker_init_fn, generator=generator,
        multiprocessing_context=loader.multiprocessing_context, timeout=loader.timeout,
        prefetch_factor=loader.prefetch_factor, in_order=getattr(loader, "in_order", None))


class LoaderWorkload(PipelineWorkload):
    """A lab's DataLoader factory; its `version` attribute is the workload version, its
    `batches` attribute (default 8, at most 32) how many batches a run reads."""

    def __init__(self, spec: str, factory: Any) -> None:
        self.name = spec
        self.version = int(getattr(factory, "version", 1))
        self.batches = min(max(int(getattr(factory, "batches", DEFAULT_BATCHES)), 1),
                           MAX_BATCHES)
        self._factory = factory

    def configurations(self, built: Built) -> list[Configuration]:
        def own() -> LoaderSpec:
            return spec_of(loader_of(self._factory()), recipe=False)

        def recipe() -> LoaderSpec:
            return spec_of(loader_of(self._factory()), recipe=True)

        return [Configuration("recipe", recipe, start=seed_process),
                Configuration("own", own)]
