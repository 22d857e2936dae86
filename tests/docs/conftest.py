"""Fixtures of the manual's tests: the manual built strictly once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.manual import built_manual


@pytest.fixture(scope="session")
def manual_site() -> Path:
    return built_manual()
