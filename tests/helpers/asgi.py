"""Driving a pure ASGI middleware with plain messages, in tests.

The coroutine runs on its own event loop in a thread of its own: the browser tests'
session-wide Playwright keeps an asyncio loop running in the main thread, where
``asyncio.run`` would refuse to start."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def run_coroutine(awaitable: Awaitable[T]) -> T:
    async def main() -> T:
        return await awaitable

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()
