"""Internal, stable for tests and benches: the agent's parts they drive directly.

Not the agent's public API (that is `numparity_agent`'s three names and the CLI), and
not for users: a name here may change with the agent, but the tests, benches and e2e
helpers change with it in the same commit, and they import the agent only from here
(a test of one private module may still import that module). Each name is the private
one under a name that says what it is in this package's terms.

Names that need torch load on first use, as in `numparity_agent`, so a bench or a
helper that only spools and uploads never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from numparity_agent._child import run_child
from numparity_agent._cli import main
from numparity_agent._config import ConfigError
from numparity_agent._config import resolve as resolve_config
from numparity_agent._devices import visible_devices
from numparity_agent._document import build_document, utc_now
from numparity_agent._environment import capture_environment, compute_env_key
from numparity_agent._flush import send_spooled
from numparity_agent._knobs import numeric_env_vars, read_knobs
from numparity_agent._lock import spool_lock
from numparity_agent._parts import UPLOADS_PATH, VALUES_PATH, BodyLimit
from numparity_agent._rng import uniform as portable_uniform
from numparity_agent._spool import KnownManifests, known_manifests_file, spool_document, spooled
from numparity_agent._suite import device_plan, drill_slot, run_suite, run_variant, select_devices
from numparity_agent._upload import MISSING_PATH, RUNS_PATH, manifest_hash, upload_document
from numparity_agent._values import ValuesStore, raw_size, values_dir
from numparity_agent._variants import get as variant
from numparity_agent._variants import names as variant_names
from numparity_agent._workloads import builtin_names as builtin_workloads
from numparity_agent._workloads import load as load_workload

__all__ = [
    "MISSING_PATH", "RUNS_PATH", "SAMPLE_M", "UPLOADS_PATH", "VALUES_MAX", "VALUES_PATH",
    "Adam", "BodyLimit", "Built", "ConfigError",
    "KnownManifests", "Recorder", "Train", "ValuesStore", "Workload", "bell_tensor",
    "build_document", "built_hashes", "builtin_workloads", "capture_environment",
    "compute_env_key", "device_plan", "drill_slot", "fingerprint", "init_default_",
    "known_manifests_file", "load_workload", "main", "manifest_hash", "numeric_env_vars",
    "portable_uniform", "raw_size", "read_knobs", "resolve_config", "run_child",
    "run_suite", "run_variant", "run_workload", "sample_positions", "select_devices",
    "send_spooled", "spool_document", "spool_lock", "spooled", "tensor_hash",
    "unsupported_half_reason", "upload_document", "utc_now", "values_dir", "variant",
    "variant_names", "visible_devices",
]

if TYPE_CHECKING:
    from numparity_agent._fingerprint import (
        SAMPLE_M,
        VALUES_MAX,
        fingerprint,
        sample_positions,
        tensor_hash,
    )
    from numparity_agent._runner import built_hashes, run_workload, unsupported_half_reason
    from numparity_agent._workloads._base import (
        Built,
        Recorder,
        Workload,
        bell_tensor,
        init_default_,
    )
    from numparity_agent._workloads.train import Adam, Train

_LAZY = {
    **dict.fromkeys(("SAMPLE_M", "VALUES_MAX", "fingerprint", "sample_positions",
                     "tensor_hash"), "numparity_agent._fingerprint"),
    **dict.fromkeys(("built_hashes", "run_workload", "unsupported_half_reason"),
                    "numparity_agent._runner"),
    **dict.fromkeys(("Built", "Recorder", "Workload", "bell_tensor", "init_default_"),
                    "numparity_agent._workloads._base"),
    **dict.fromkeys(("Adam", "Train"), "numparity_agent._workloads.train"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'numparity_agent.testing' has no attribute {name!r}")
