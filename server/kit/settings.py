"""Server settings: one pydantic-settings class, environment prefix ``NUMPARITY_``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1024 * 1024


class Settings(BaseSettings):
    """Every setting has a description: the manual's settings page is generated from
    them (docs/_gen/reference.py), and a test fails on one without."""

    model_config = SettingsConfigDict(env_prefix="NUMPARITY_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///./numparity.db",
        description="The database, as a SQLAlchemy URL: sqlite:///PATH, or "
        "postgresql+psycopg://USER:PASSWORD@HOST/NAME for a lab (several processes need "
        "PostgreSQL).")
    migrate_on_start: bool = Field(
        default=False,
        description="Run the migrations to the newest schema when the server starts. "
        "Replicas may do so at once: a migration holds a lock in the database, and the "
        "others wait for it, then find the schema current.")
    max_body_bytes: int = Field(
        default=32 * MIB, gt=0,
        description="Upper bound of a request body, before and after gzip decoding (413 "
        "over it).")
    max_document_bytes: int = Field(
        default=128 * MIB, gt=0,
        description="The largest run document, after gzip decoding, that the agent may send "
        "in parts when one body would pass NUMPARITY_MAX_BODY_BYTES (design §3.2, uploads "
        "in parts).")
    max_values_bytes: int = Field(
        default=1024 * MIB, gt=0,
        description="The largest values of one tensor that the agent may send in parts. A "
        "token holds at most twice this much of unfinished parts; parts untouched for a "
        "day are dropped (when an upload begins, and by retention).")
    body_timeout_s: float = Field(
        default=30.0, gt=0,
        description="A request body must have arrived whole this many seconds after the "
        "request began, else 408: no route, and no database session, runs before it has.")
    token_bytes_per_s: float = Field(
        default=1 * MIB, ge=0,
        description="What one token may send, in bytes a second, once it has sent "
        "NUMPARITY_MAX_DOCUMENT_BYTES (or NUMPARITY_MAX_BODY_BYTES, if larger) at once, "
        "so a new node's whole first upload goes at once (a request costs at least 64 KiB "
        "and at most that; a gzip body pays what it decodes to; a check plan the server "
        "computes for it, 64 KiB); beyond it 429 "
        "with Retry-After, and the agent retries. Per token and per server process; 0 "
        "turns the budget off. Tokens shared by a whole fleet share one budget (per-node "
        "tokens are the recommended setup).")
    max_clock_skew_s: float = Field(
        default=86_400.0, ge=0,
        description="How far ahead of the server's clock a run's started_at and "
        "finished_at may be (422 beyond).")
    open_reads: bool = Field(
        default=False,
        description="Open the read endpoints, the dashboard and /metrics to anyone who can "
        "reach the server (trusted networks only). Writes always need a token.")
    page_default: int = Field(
        default=50, gt=0,
        description="Items a page of a list endpoint holds when the request gives no limit.")
    page_max: int = Field(
        default=500, gt=0, description="The largest limit a list endpoint takes (422 over it).")
    db_pool_size: int = Field(
        default=5, gt=0,
        description="Database connections each server process keeps open (PostgreSQL).")
    db_max_overflow: int = Field(
        default=10, ge=0,
        description="Connections a server process may open beyond the pool at busy times "
        "(PostgreSQL).")
    retention_days: int | None = Field(
        default=None, gt=0,
        description="Runs received more than this many days ago are dropped by "
        "`numparity-server retention` (those holding a node's latest result are kept). "
        "Unset keeps everything.")
    sqlite_busy_timeout_ms: int = Field(
        default=30_000, ge=0,
        description="How long a SQLite connection waits for another process's write before "
        "giving up (503).")
    policy_file: Path | None = Field(
        default=None,
        description="The lab's policy file (TOML): allowed versions, required knobs, "
        "tolerances per workload, when a node is stale, how many peers suspect hardware "
        "needs. Read once at start-up; a file that is missing or wrong stops the server.")
    metrics_cache_seconds: float = Field(
        default=15.0, ge=0,
        description="GET /metrics reads the fleet's figures (the audit's status counts, "
        "the groups) from the database at most this often; scrapes in between answer the "
        "same figures.")
    read_cache_seconds: float = Field(
        default=0.0, ge=0,
        description="The fleet-wide reads (/audit, /divergence, the fleet and workload "
        "pages) keep their answers against the fleet's version: one this many seconds old "
        "may still be served after a newer upload (0: never, every answer is as of the "
        "newest upload).")
    read_cache_max_age_s: float = Field(
        default=60.0, ge=0,
        description="No kept answer of a fleet-wide read is served once it is older than "
        "this many seconds.")
    compute_seconds: float = Field(
        default=1.0, ge=0,
        description="The reads' heavy computations (an op-trace alignment, 256 tensors of "
        "a result compared with their whole values): a request starts none after computing "
        "this many seconds; what is left is answered as pending and computed by the next "
        "asks (what was computed is kept).")
    compute_slots: int = Field(
        default=2, gt=0,
        description="How many of the reads' heavy computations a server process runs at "
        "once.")
    worker_threads: int = Field(
        default=16, gt=0,
        description="Requests a server process serves at once on worker threads (every "
        "route that reads the database); more wait their turn without taking the GIL from "
        "the event loop (45 clients hammering one read kept /healthz waiting 5.6 s with "
        "anyio's default of 40).")
    check_cache_seconds: float = Field(
        default=30.0, ge=0,
        description="What `numparity-agent check` is answered (GET /api/v1/agent/check) is "
        "kept per question (whatever its budget) and pin version: served up to this many "
        "seconds after a newer upload (a cluster starting its jobs at once asks one "
        "computation), never after a new pin.")
    public_url: str | None = Field(
        default=None,
        description="The URL browsers use to reach the server (e.g. "
        "https://numparity.lab.example) when a proxy in front rewrites the Host header: "
        "the dashboard's sign-in and sign-out forms are accepted from this origin as well "
        "as from the Host the browser asked for.")
    manual_dir: Path | None = Field(
        default=None,
        description="A built manual (`make docs` writes one to site/) to serve at /manual/ "
        "instead of the one the installed package carries. The dashboard's help links "
        "lead there.")


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
