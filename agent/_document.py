"""The run document `numparity.run/v1` (design §2.7)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from numparity_agent import __version__

SCHEMA = "numparity.run/v1"


def utc_now() -> str:
    """ISO 8601 UTC with a Z suffix, to the second."""
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def build_document(
    *,
    node: str,
    labels: dict[str, str],
    environment: dict[str, Any],
    results: list[dict[str, Any]],
    started_at: str,
    finished_at: str,
    drill: bool = False,
    run_id: str | None = None,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "run_id": run_id or str(uuid.uuid4()),
        "node": {"name": node, "labels": dict(labels)},
        "agent_version": __version__,
        "started_at": started_at,
        "finished_at": finished_at,
        "drill": drill,
        "environment": environment,
        "results": results,
    }
