"""tests/gpu: `make gpu-check`'s rows asserted on a real GPU. Every test here is marked
`gpu` and skips where torch sees no CUDA device, so CI (which has none) never runs them;
a lab runs `pytest tests/gpu` (or `make gpu-check`) on each new GPU type."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tests/gpu; `make gpu-check`)")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)
            if not cuda:
                item.add_marker(skip)
