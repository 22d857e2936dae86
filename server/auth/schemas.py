"""Roles, the authenticated principal, and token views."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

Role = Literal["agent", "reader", "admin"]
ROLES: tuple[Role, ...] = ("agent", "reader", "admin")


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id and role, or an anonymous reader (open reads)."""

    role: Role | Literal["anonymous"]
    token_id: int | None = None
    label: str = ""

    def has(self, role: Role) -> bool:
        # admin implies every role; the others are separate (an agent cannot read).
        return self.role == role or self.role == "admin"


class TokenOut(BaseModel):
    id: int
    role: str
    label: str
    created_at: datetime
    revoked_at: datetime | None


class CreatedToken(BaseModel):
    """The only time the token itself exists outside the caller: shown once."""

    id: int
    role: str
    label: str
    token: str
