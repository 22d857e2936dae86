"""The fleet's version: one row, its counter advanced by every write the fleet-wide reads
depend on, in that write's own transaction (``kit.db.writing``).

The read cache (``kit.readcache``) keys an answer on it. The newest ``runs.id`` was that
key once, and was not exact: PostgreSQL hands an id out at insert, not at commit, so a
slow upload (id 28) committing after a fast one (id 29) changed no maximum, and every
replica served answers without it until the cache's maximum age. A counter advanced in
the writing transaction changes exactly when that transaction commits, on every replica.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base

# The one row's key.
FLEET_VERSION_ROW = 1


class FleetVersion(Base):
    __tablename__ = "fleet_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)
