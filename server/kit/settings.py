"""Server settings: one pydantic-settings class, environment prefix ``NUMPARITY_``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1024 * 1024


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NUMPARITY_", extra="ignore")

    database_url: str = "sqlite:///./numparity.db"
    # Run Alembic to head when the app starts. With several replicas prefer
    # `numparity-server migrate` (or `serve --migrate`) once, before they start.
    migrate_on_start: bool = False
    # Upper bound of a request body, before and after gzip decoding.
    max_body_bytes: int = Field(default=32 * MIB, gt=0)
    # A request body must have arrived whole this many seconds after the request began,
    # else 408: no route (and no database session) runs before it has.
    body_timeout_s: float = Field(default=30.0, gt=0)
    # What one token may send, in bytes a second, once it has sent NUMPARITY_MAX_BODY_BYTES
    # at once (a request costs at least 64 KiB); beyond it 429 with Retry-After, and the
    # agent retries. Per token and per server process; 0 turns the budget off. Tokens
    # shared by a whole fleet share one budget (per-node tokens are the recommended setup).
    token_bytes_per_s: float = Field(default=1 * MIB, ge=0)
    # started_at/finished_at may be at most this far ahead of the server's clock (422).
    max_clock_skew_s: float = Field(default=86_400.0, ge=0)
    # Opens read endpoints to anyone who can reach the server (trusted networks only).
    # Writes always need a token.
    open_reads: bool = False
    page_default: int = Field(default=50, gt=0)
    page_max: int = Field(default=500, gt=0)
    db_pool_size: int = Field(default=5, gt=0)
    db_max_overflow: int = Field(default=10, ge=0)
    # Runs received more than this many days ago are dropped by `numparity-server
    # retention` (those holding a node's latest result are kept). None keeps everything.
    retention_days: int | None = Field(default=None, gt=0)
    sqlite_busy_timeout_ms: int = Field(default=30_000, ge=0)
    # The lab's policy (TOML): allowed versions, required knobs, tolerances per workload,
    # when a node is stale, how many peers suspect hardware needs. See the README.
    policy_file: Path | None = None
    # GET /metrics reads the fleet's figures (the audit's status counts, the groups) from the
    # database at most this often; scrapes in between answer the same figures.
    metrics_cache_seconds: float = Field(default=15.0, ge=0)
    # The fleet-wide reads (/audit, /divergence, the fleet and workload pages) keep their
    # answers against the fleet's version (kit.readcache): one that is this many seconds
    # old may still be served after a newer upload (0: never, every answer is as of the
    # newest upload), and none is served once older than read_cache_max_age_s.
    read_cache_seconds: float = Field(default=0.0, ge=0)
    read_cache_max_age_s: float = Field(default=60.0, ge=0)
    # The reads' heavy computations (an op-trace alignment, a result's tensors compared
    # with their whole values: kit.compute): a request starts none after computing this
    # many seconds (what is left is answered as pending and computed by the next asks:
    # what was computed is kept), and a server process runs at most compute_slots at once.
    compute_seconds: float = Field(default=1.0, ge=0)
    compute_slots: int = Field(default=2, gt=0)
    # Requests a server process serves at once on worker threads (every route that reads
    # the database). More threads than this wait their turn without taking the GIL from
    # the event loop: 45 clients hammering one read kept /healthz waiting 5.6 s with
    # anyio's default of 40 threads.
    worker_threads: int = Field(default=16, gt=0)
    # The URL browsers use to reach the server (e.g. https://numparity.lab.example) when a
    # proxy in front rewrites the Host header: the dashboard's sign-in and sign-out forms
    # are accepted from this origin as well as from the Host the browser asked for.
    public_url: str | None = None


def worker_environment(settings: Settings) -> dict[str, str]:
    """``settings`` as ``NUMPARITY_*`` variables, for server processes started by name.

    uvicorn's worker processes (``serve --workers N``) build their app from an import
    string, so ``settings`` cannot be handed to them; this is the one place they get it.
    """
    environment = {}
    for name, value in settings.model_dump(mode="json").items():
        if value is not None:
            environment[f"NUMPARITY_{name.upper()}"] = str(value).lower() \
                if isinstance(value, bool) else str(value)
    return environment
