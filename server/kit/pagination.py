"""Limit/offset pagination with a server maximum (setting ``page_max``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

Item = TypeVar("Item")


@dataclass(frozen=True)
class PageParams:
    limit: int
    offset: int


class Page(BaseModel, Generic[Item]):
    items: list[Item]
    total: int
    limit: int
    offset: int

