"""Roles, the authenticated principal, and token views."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Literal

from pydantic import BaseModel

Role = Literal["agent", "reader", "admin", "check"]
ROLES: tuple[Role, ...] = ("agent", "reader", "admin", "check")


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id and role, or an anonymous reader (open reads); an
    agent token may be bound to node names and patterns (design §3.6)."""

    role: Role | Literal["anonymous"]
    token_id: int | None = None
    label: str = ""
    node_names: tuple[str, ...] = ()
    node_patterns: tuple[str, ...] = ()

    def has(self, role: Role) -> bool:
        # admin implies every role; an agent may also check (the plan is what its own
        # runs are compared with); the others are separate (an agent cannot read, a
        # check token reads the plan and writes nothing).
        return (self.role == role or self.role == "admin"
                or (role == "check" and self.role == "agent"))

    @property
    def bound(self) -> bool:
        return bool(self.node_names or self.node_patterns)

    def may_write_node(self, name: str) -> bool:
        """Whether this token may write runs of node ``name``: an unbound token writes
        any node; a bound one its names, and the names its shell-style patterns match
        (``gpu-*``, ``rack[12]-?``; case-sensitive, as node names are)."""
        return (not self.bound or name in self.node_names
                or any(fnmatchcase(name, pattern) for pattern in self.node_patterns))


def binding_text(node_names: Sequence[str] | None, node_patterns: Sequence[str] | None) -> str:
    """A token's binding in words: ``gpu-01, gpu-02, pattern gpu-*``; "" when unbound."""
    return ", ".join([*(node_names or ()), *(f"pattern {p}" for p in node_patterns or ())])


class TokenOut(BaseModel):
    id: int
    role: str
    label: str
    created_at: datetime
    revoked_at: datetime | None
    # None: the token is not bound (an agent token then writes runs of any node).
    node_names: list[str] | None = None
    node_patterns: list[str] | None = None


class CreatedToken(BaseModel):
    """The only time the token itself exists outside the caller: shown once."""

    id: int
    role: str
    label: str
    token: str
    node_names: list[str] | None = None
    node_patterns: list[str] | None = None
