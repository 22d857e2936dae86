"""DataLoader factories (`--workloads module:factory`, design §2.2) for the agent's tests:
a lab's own data pipelines, good and bad."""

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info


class Offsets(Dataset):
    """16 items; each draws a 4-number offset from numpy's global generator (the lab's
    augmentation); `x` and `label` follow from the index alone."""

    def __len__(self):
        return 16

    def __getitem__(self, index):
        offset = torch.from_numpy(np.random.randint(0, 1_000_000, size=4))
        return {"offset": offset, "x": torch.full((3,), float(index)) + offset[:3].float(),
                "label": torch.tensor(index)}


def every_worker_seeded_alike(worker_id):
    """The lab's bug: a worker_init_fn that gives every worker the same seed."""
    np.random.seed(1234)


def seed_worker(worker_id):
    """The recipe's worker_init_fn, as a lab writes it."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def duplicating():
    """A lab's loader whose worker_init_fn reseeds numpy alike in every worker."""
    return DataLoader(Offsets(), batch_size=4, shuffle=True,
                      worker_init_fn=every_worker_seeded_alike)


def seeded():
    """A lab's loader that follows the seeds' recipe itself."""
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    return DataLoader(Offsets(), batch_size=4, shuffle=True, worker_init_fn=seed_worker,
                      generator=torch.Generator().manual_seed(7))


seeded.batches = 3
seeded.version = 5


def settings():
    """A dataset and the DataLoader's settings (its num_workers is the agent's)."""
    return Offsets(), {"batch_size": 4, "shuffle": True, "num_workers": 7}


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8))


def iterable():
    return DataLoader(Stream(), batch_size=2)


class Missing(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        raise FileNotFoundError(f"shard {index} of the lab's data is missing")


def missing():
    return DataLoader(Missing(), batch_size=2)


class Jittered(Dataset):
    """A lab's dataset that holds numpy's recommended generator (`default_rng`), seeded,
    and reseeds it in each worker: reproducible, and its draws are numpy's."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed):
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return 12

    def __getitem__(self, index):
        return {"jitter": torch.from_numpy(self.rng.standard_normal(3)),
                "label": torch.tensor(index)}


def reseed_worker(worker_id):
    get_worker_info().dataset.reseed(torch.initial_seed() % 2**32)


def held():
    """A reproducible lab pipeline whose augmentation is numpy's Generator."""
    return DataLoader(Jittered(11), batch_size=3, shuffle=True, worker_init_fn=reseed_worker,
                      generator=torch.Generator().manual_seed(11))
