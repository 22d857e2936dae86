"""Data pipeline determinism (design §2.2): one DataLoader configuration measured under
the conditions the seeds' recipe is about, and its four checks.

A *configuration* is a way to build a loader ("recipe": the seeds' recipe; "no_recipe":
none of it; "own": a lab's loader as its factory built it). Each is measured:

- **run 1**: one epoch (at most `batches` batches) at every worker count, each from the
  same state of the process's generators (torch's default, numpy's global, `random`);
- **run 2**: the same after other code has drawn once from each of those generators,
  which is what a fresh process does too (numpy and `random` seed themselves from the
  operating system's entropy at start, and so does torch's default generator in recent
  releases: measured, `doctor`);
- **probes**: one batch of indices handed to every worker twice over, so that two
  workers whose augmentation streams are the same return the same bytes for it; in one
  process (no workers) the same batch drawn twice tells which parts of a batch are
  random at all.

The checks (`_pipeline_checks`) compare sha256 hashes of every tensor of every batch
(`leaves`): nothing is kept but the batches of the configuration's first run at the
recorded worker counts, fingerprinted when its two runs agree (a configuration whose
bytes change from run to run has nothing to compare across nodes; it would split every
node from every other).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

from numparity_agent._fingerprint import tensor_hashes
from numparity_agent._inject import (
    RemoteDrill,
    RemoteReport,
    Site,
    begin_member,
    member_report,
    remote_site,
)
from numparity_agent._workloads._base import Built, Recorder, Workload
from numparity_agent._workloads._pipeline_checks import (
    Epoch,
    Measured,
    checks_of,
    reproducible,
)

# The worker counts a configuration is measured at, bounded by the CPUs the process may
# use (but never below 2: distinct streams need two workers).
WORKER_COUNTS = (0, 2, 4)
# The counts whose batches are fingerprinted: every node runs them whatever its CPUs, so
# every node's tensor list is the same.
RECORDED_COUNTS = (0, 2)
# The seed the recipe gives every generator (the strict variant's).
RECIPE_SEED = 0
# A worker that does not answer in this time fails the workload rather than hanging it.
LOADER_TIMEOUT_S = 120.0
# What a batch may hold: tensors beyond these are not compared, and a leaf's name is cut
# to this length (the server takes an op of 255 characters, a tensor name of 512). With
# `_user_data.MAX_BATCHES`, a result stays under the server's 4,096 tensors.
MAX_LEAVES = 16
MAX_LEAF_NAME = 120
# The probe hands every worker the same batch this many times: a leaf is random when a
# round differs from the first (a coin flip per item in batches of 4 looks constant in
# two rounds one time in 16, in four one time in 4,096), and two workers repeat each
# other when they agree in every round.
PROBE_ROUNDS = 4
# The DataLoader's advice when there are more workers than CPUs: the bound is ours.
_MANY_WORKERS = r"This DataLoader will create \d+ worker processes"


def worker_counts(cpus: int | None = None) -> tuple[int, ...]:
    """`WORKER_COUNTS` that this process's CPUs allow (at least 0 and 2)."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
    return tuple(n for n in WORKER_COUNTS if n <= max(2, cpus))


def fast_start_method() -> str | None:
    """`fork` where the platform has it: a forked worker starts in tens of milliseconds,
    a spawned one imports torch again (seconds). None: the platform's default."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else None


# ---- the process's generators ------------------------------------------------------------


@dataclass(frozen=True)
class Generators:
    """The state of the generators a pipeline may draw from in this process."""

    torch_state: torch.Tensor
    numpy_state: Any
    random_state: Any

    @classmethod
    def capture(cls) -> Generators:
        return cls(torch.get_rng_state(), np.random.get_state(), random.getstate())

    def restore(self) -> None:
        torch.set_rng_state(self.torch_state)
        np.random.set_state(self.numpy_state)
        random.setstate(self.random_state)


def draw_from_each() -> None:
    """Other code drawing once from torch's, numpy's and Python's global generators."""
    torch.rand(1)
    np.random.random()
    random.random()


def seed_process(seed: int = RECIPE_SEED) -> None:
    """The recipe's start: every generator of the process seeded once. torch's CPU
    generator only (`torch.default_generator`, not `torch.manual_seed`): the pipeline
    draws on the CPU, and a GPU's generators stay as the workloads left them."""
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)


class SeedWorker:
    """The recipe's `worker_init_fn`: numpy's and Python's generators seeded from
    `torch.initial_seed()` (which the DataLoader sets to its base seed + the worker id
    in each worker), and a dataset's own generators through its `reseed(seed)` if it has
    one; then `then`, the lab's own worker_init_fn, if any. A class, so spawned
    workers can unpickle it."""

    def __init__(self, then: Callable[[int], None] | None = None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        seed = torch.initial_seed() % 2**32
        np.random.seed(seed)
        random.seed(seed)
        info = get_worker_info()
        reseed = getattr(info.dataset, "reseed", None) if info is not None else None
        if callable(reseed):
            reseed(seed)
        if self.then is not None:
            self.then(worker_id)


def recipe_generator() -> torch.Generator:
    """The recipe's loader generator: its own, with a fixed seed."""
    return torch.Generator().manual_seed(RECIPE_SEED)


# ---- one loader, one epoch -----------------------------------------------------------------


@dataclass
class LoaderSpec:
    """What a loader of a configuration is made of, fresh for one run: the engine builds
    the DataLoader (tagging each batch with its worker, recording the sampler's order)."""

    dataset: Any
    batch_sampler: Iterable[list[int]]
    batch_size: int
    collate_fn: Callable[[list[Any]], Any]
    worker_init_fn: Callable[[int], None] | None = None
    generator: torch.Generator | None = None
    multiprocessing_context: Any = None
    timeout: float = LOADER_TIMEOUT_S
    prefetch_factor: int | None = None
    in_order: bool | None = None


class Tagged:
    """A collate function that also says which worker collated the batch (-1: the main
    process). It runs where the batch is made, in the worker."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, items: list[Any]) -> tuple[int, Any]:
        info = get_worker_info()
        batch = self.collate_fn(items)
        member_report()  # an op drill's part in this worker, after each batch
        return (-1 if info is None else info.id), batch


class DrillWorkers:
    """The workers of one epoch as a site of an op drill (design §2.6, `_inject.Site`):
    each worker installs its part first (`worker_init_fn`, then the loader's own) and
    leaves its report, after each batch, in a file of `folder` the parent reads once
    the workers are shut down. A class, so spawned workers can unpickle it."""

    def __init__(self, drills: list[RemoteDrill], folder: str,
                 then: Callable[[int], None] | None) -> None:
        self.drills, self.folder, self.then = drills, folder, then

    def __call__(self, worker_id: int) -> None:
        path = os.path.join(self.folder, f"worker{worker_id}")

        def deliver(report: RemoteReport) -> None:
            with open(path + ".part", "wb") as out:
                pickle.dump(report, out)
            os.replace(path + ".part", path)  # never half a report

        begin_member(self.drills[worker_id], deliver)
        if self.then is not None:
            self.then(worker_id)

    def reports(self) -> list[RemoteReport | None]:
        found: list[RemoteReport | None] = []
        for worker in range(len(self.drills)):
            try:
                with open(os.path.join(self.folder, f"worker{worker}"), "rb") as report:
                    found.append(pickle.load(report))
            except FileNotFoundError:  # a worker that made no batch
                found.append(None)
        return found


class _Recording:
    """A batch sampler that keeps the indices it hands out (in the main process), lazily
    like the DataLoader's own, so the loader draws its base seed before the sampler
    draws its permutation, as it does without us."""

    def __init__(self, inner: Iterable[list[int]]) -> None:
        self.inner = inner
        self.handed: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        for indices in self.inner:
            self.handed.append([int(i) for i in indices])
            yield indices


class _Repeating:
    """The probe's batch sampler: the same indices `times` times."""

    def __init__(self, indices: list[int], times: int) -> None:
        self.indices, self.times = indices, times

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.times):
            yield list(self.indices)

    def __len__(self) -> int:
        return self.times


def _loader(spec: LoaderSpec, num_workers: int, batch_sampler: Iterable[list[int]],
            worker_init_fn: Callable[[int], None] | None) -> DataLoader[Any]:
    kwargs: dict[str, Any] = {}
    if num_workers:
        kwargs.update(multiprocessing_context=spec.multiprocessing_context,
                      timeout=spec.timeout or LOADER_TIMEOUT_S,
                      prefetch_factor=spec.prefetch_factor or 2)
    if spec.in_order is not None:
        kwargs["in_order"] = spec.in_order
    return DataLoader(spec.dataset, batch_sampler=batch_sampler,  # type: ignore[arg-type]
                      collate_fn=Tagged(spec.collate_fn), num_workers=num_workers,
                      worker_init_fn=worker_init_fn, generator=spec.generator,
                      **kwargs)


def leaves(batch: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """The tensors of a batch, named by their path (dict keys, tuple positions joined by
    dots; a batch that is one tensor is `batch`), depth first; numpy arrays count as
    tensors, anything else (strings, file names) is left out."""
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(np.ascontiguousarray(batch))
    if isinstance(batch, torch.Tensor):
        return [((prefix or "batch")[:MAX_LEAF_NAME], batch)]
    if isinstance(batch, Mapping):
        items: Iterable[tuple[Any, Any]] = batch.items()
    elif isinstance(batch, tuple | list):
        items = enumerate(batch)
    else:
        return []
    found = []
    for key, value in items:
        found.extend(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return found[:MAX_LEAVES]


def read_epoch(spec: LoaderSpec, num_workers: int, *, limit: int, keep: bool = False,
               batch_sampler: Iterable[list[int]] | None = None) -> Epoch:
    """Iterate a loader of `spec` with `num_workers` for at most `limit` batches."""
    recording = _Recording(spec.batch_sampler if batch_sampler is None else batch_sampler)
    epoch = Epoch(order=[], workers=[], names=[], hashes=[])
    # Under an op drill, the workers' ops are drilled too (`DrillWorkers`).
    site: Site | None = remote_site("worker") if num_workers else None
    if site is None:
        _read(spec, num_workers, limit, keep, recording, epoch, spec.worker_init_fn)
    else:
        folder = tempfile.mkdtemp(prefix="numparity-drill-")
        try:
            workers = DrillWorkers([site.member(w) for w in range(num_workers)], folder,
                                   spec.worker_init_fn)
            _read(spec, num_workers, limit, keep, recording, epoch, workers)
            site.absorb(workers.reports())
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    # The sampler runs ahead of the batches read (prefetching): keep the ones read.
    epoch.order = recording.handed[:len(epoch.workers)]
    return epoch


def _read(spec: LoaderSpec, num_workers: int, limit: int, keep: bool, recording: _Recording,
          epoch: Epoch, worker_init_fn: Callable[[int], None] | None) -> None:
    """The batches of one epoch into `epoch`; every worker shut down before it returns."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_MANY_WORKERS)
        iterator = iter(_loader(spec, num_workers, recording, worker_init_fn))
        try:
            for worker, batch in iterator:
                named = leaves(batch)
                if not named:
                    raise ValueError("the loader's batches hold no tensor to compare")
                epoch.workers.append(worker)
                epoch.names.append([name for name, _ in named])
                epoch.hashes.append(tensor_hashes([tensor for _, tensor in named]))
                if keep:
                    epoch.tensors.append([tensor.clone() for _, tensor in named])
                if len(epoch.workers) == limit:
                    break
        finally:
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:  # now, not whenever the iterator is collected
                shutdown()
            del iterator


# ---- a configuration, measured ------------------------------------------------------------


@dataclass(frozen=True)
class Configuration:
    """How to build one configuration's loader for a run (fresh objects each time) and
    what the process does first (`start`: the recipe seeds every generator)."""

    name: str
    make: Callable[[], LoaderSpec]
    start: Callable[[], None] | None = None


def measure(config: Configuration, *, counts: Sequence[int], limit: int,
            keep: Sequence[int] = RECORDED_COUNTS) -> Measured:
    """Runs 1 and 2 at every count, and the probes; the process's generators are left
    as they were found."""
    found = Generators.capture()
    try:
        def run(count: int, *, disturbed: bool, probe: bool = False) -> Epoch:
            found.restore()
            if disturbed:
                draw_from_each()
            if config.start is not None:
                config.start()
            spec = config.make()
            if not probe:
                return read_epoch(spec, count, limit=limit, keep=count in keep)
            indices = list(range(min(spec.batch_size, len(spec.dataset))))
            rounds = PROBE_ROUNDS * max(count, 1)
            return read_epoch(spec, count, limit=rounds,
                              batch_sampler=_Repeating(indices, rounds))

        first = {count: run(count, disturbed=False) for count in counts}
        second = {count: run(count, disturbed=True) for count in counts}
        probes = {count: run(count, disturbed=False, probe=True) for count in counts}
    finally:
        found.restore()
    return Measured(config.name, tuple(counts), first, second, probes)


def record(m: Measured, recorder: Recorder, counts: Sequence[int] = RECORDED_COUNTS) -> None:
    """The configuration's run-1 order and batches at `counts`, fingerprinted."""
    if m.first[m.counts[0]].order:
        order = [i for batch in m.first[m.counts[0]].order for i in batch]
        recorder.record(f"{m.name}.order", "output", torch.tensor(order, dtype=torch.int64))
    for n in counts:
        epoch = m.first[n]
        for batch, (names, tensors) in enumerate(zip(epoch.names, epoch.tensors, strict=True)):
            for name, tensor in zip(names, tensors, strict=True):
                recorder.record(f"{m.name}.w{n}.batch{batch}.{name}", "output", tensor)


class PipelineWorkload(Workload):
    """A workload that measures DataLoader configurations (`configurations`), records the
    reproducible ones' batches and reports the checks of all (design §2.2)."""

    # Its work happens in worker processes: no op trace, no model to compile.
    traceable = False
    compilable = False
    # The loader draws no arithmetic a variant changes (dtype, autocast, TF32): measured
    # once, under the node's defaults.
    variants = frozenset({"default"})
    # It runs every configuration twice itself (runs 1 and 2): the agent's repeats would
    # only measure the same again.
    max_repeats = 1
    batches = 8

    def configurations(self, built: Built) -> list[Configuration]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Fields of the result's `data` besides the measurement's."""
        return {}

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        return Built(model=torch.nn.Module(), inputs={})

    def run(self, built: Built, recorder: Recorder) -> None:
        counts = worker_counts()
        checks: dict[str, dict[str, Any]] = {}
        recorded: list[str] = []
        for config in self.configurations(built):
            measured = measure(config, counts=counts, limit=self.batches)
            found = checks_of(measured)
            checks.update(found)
            if reproducible(found, config.name):
                record(measured, recorder)
                recorded.append(config.name)
        recorder.fields["checks"] = checks
        recorder.fields["data"] = {"num_workers": list(counts), "batches": self.batches,
                                   "recorded": recorded, **self.describe()}
