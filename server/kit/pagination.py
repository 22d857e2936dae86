"""Limit/offset pagination with a server maximum (setting ``page_max``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

Item = TypeVar("Item")

# The largest offset a list accepts: far beyond any table, far below the int64 the
# databases take (past 2^63 SQLite raises OverflowError and PostgreSQL an out-of-range
# error, which were 500s).
MAX_OFFSET = 1_000_000_000


@dataclass(frozen=True)
class PageParams:
    limit: int
    offset: int


class Page(BaseModel, Generic[Item]):
    items: list[Item]
    total: int
    limit: int
    offset: int

