"""`data`: a DataLoader with random augmentations, with and without the seeds' recipe
(design §2.2).

The dataset: 48 images of 1×16×16 from the portable generator (design §2.1), each
returned as an 8×8 crop with four augmentations, each drawn from another generator:

| leaf | drawn from | what it does |
| --- | --- | --- |
| `crop` | Python's `random` (global) | the crop's top-left corner, 2 × `randrange(9)` |
| `brightness` | torch's default generator | a factor in [0.75, 1.25) |
| `noise` | numpy's global generator | 8×8 normal noise × 0.1 |
| `jitter` | a numpy `Generator` the dataset holds (`default_rng`) | an offset in [-0.1, 0.1) |

and `image` = crop × brightness + noise + jitter (each a float32 operation, correctly
rounded on any CPU). Batches of 8, shuffled.

Two configurations, each measured by `_pipeline`:

- `no_recipe`: `DataLoader(dataset, batch_size=8, shuffle=True)`, the dataset's
  generator made without a seed;
- `recipe`: the seeds' recipe: `random`, numpy and torch seeded once at start, the
  dataset's generator seeded, `worker_init_fn` seeding numpy and `random` from
  `torch.initial_seed()` (and the dataset's generator through its `reseed`), and
  `generator=torch.Generator().manual_seed(0)`.

Workers start by `fork` where the platform has it (`_pipeline.fast_start_method`).
An op drill (design §2.6) reaches the augmentations in the workers too (each epoch with
workers is a site of the drill: `_pipeline.DrillWorkers`): their five elementwise ops
per item (brightness = rand·0.5 + 0.75; image = crop·brightness + noise + jitter).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, Dataset, RandomSampler, default_collate

from numparity_agent._workloads._base import Built, uniform_tensor
from numparity_agent._workloads._pipeline import (
    RECIPE_SEED,
    Configuration,
    LoaderSpec,
    PipelineWorkload,
    SeedWorker,
    fast_start_method,
    recipe_generator,
    seed_process,
)

ITEMS = 48
SOURCE = 16  # the stored images' side
CROP = 8  # the crop's side
BATCH = 8
# Which generator each augmentation draws from (the result's `data.sources`).
SOURCES = {"crop": "random", "brightness": "torch", "noise": "numpy",
           "jitter": "numpy Generator held by the dataset"}


class AugmentedImages(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, images: torch.Tensor, seed: int | None) -> None:
        self.images = images
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        """What the recipe's worker_init_fn calls in each worker."""
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        top, left = random.randrange(SOURCE - CROP + 1), random.randrange(SOURCE - CROP + 1)
        brightness = torch.rand(1) * 0.5 + 0.75
        noise = torch.from_numpy(
            (np.random.standard_normal((CROP, CROP)) * 0.1).astype(np.float32))
        jitter = torch.from_numpy((self.rng.random(1) * 0.2 - 0.1).astype(np.float32))
        crop = self.images[index, :, top:top + CROP, left:left + CROP]
        # The augmentations first: a check names the first leaf that differs.
        return {"crop": torch.tensor([top, left]), "brightness": brightness,
                "noise": noise, "jitter": jitter,
                "image": crop * brightness + noise + jitter}


class Data(PipelineWorkload):
    name = "data"
    version = 1
    batches = ITEMS // BATCH

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        # The stored images are the inputs (input_hash): the same on every node. The
        # pipeline computes on the CPU in float32 whatever the variant.
        images = uniform_tensor(self, "images", (ITEMS, 1, SOURCE, SOURCE), 0.0, 1.0)
        return Built(model=torch.nn.Module(), inputs={"images": images})

    def describe(self) -> dict[str, Any]:
        return {"batch_size": BATCH, "start_method": fast_start_method() or "default",
                "sources": SOURCES}

    def configurations(self, built: Built) -> list[Configuration]:
        images = built.inputs["images"]

        def loader(seed: int | None, recipe: bool) -> LoaderSpec:
            dataset = AugmentedImages(images, seed)
            generator = recipe_generator() if recipe else None
            sampler = RandomSampler(dataset, generator=generator)
            return LoaderSpec(dataset=dataset,
                              batch_sampler=BatchSampler(sampler, BATCH, drop_last=False),
                              batch_size=BATCH, collate_fn=default_collate,
                              worker_init_fn=SeedWorker() if recipe else None,
                              generator=generator,
                              multiprocessing_context=fast_start_method())

        return [
            Configuration("recipe", lambda: loader(RECIPE_SEED, True), start=seed_process),
            Configuration("no_recipe", lambda: loader(None, False)),
        ]
