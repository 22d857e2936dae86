"""Limit/offset pagination with a server maximum (setting ``page_max``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

from fastapi import Depends, Query
from pydantic import BaseModel

from numparity_server.kit.deps import SettingsDep
from numparity_server.kit.errors import InvalidDocument

Item = TypeVar("Item")


@dataclass(frozen=True)
class PageParams:
    limit: int
    offset: int


def page_params(
    settings: SettingsDep,
    limit: Annotated[int | None, Query(ge=1, description="items per page")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> PageParams:
    if limit is not None and limit > settings.page_max:
        raise InvalidDocument.at(["query", "limit"],
                                 f"at most {settings.page_max} items per page")
    return PageParams(limit=limit or min(settings.page_default, settings.page_max), offset=offset)


class Page(BaseModel, Generic[Item]):
    items: list[Item]
    total: int
    limit: int
    offset: int


Pagination = Annotated[PageParams, Depends(page_params)]
