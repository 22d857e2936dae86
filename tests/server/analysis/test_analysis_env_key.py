"""The server derives the env_key of the environment beside it as the agent does
(design §2.5, issue 42): a real agent's document of a two-GPU node, its GPUs reordered
by CUDA_VISIBLE_DEVICES, has the key the server derives; a document of an agent from
before (its GPUs keyed as listed, index and all) is still accepted; any other key not."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from helpers.agent import fake_gpu, fake_gpu_env, run_agent

from numparity_server.analysis.environment import derived_env_key, legacy_env_key


def _old_agents_key(environment: dict[str, Any]) -> str:
    """The rule of agents before issue 42, written out again (the oracle)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k not in ("env_key", "hostname", "uuid", "serial", "unknown")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    canonical = json.dumps(strip(environment), sort_keys=True, separators=(",", ":"),
                           default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_the_server_derives_a_real_agents_key_and_still_an_old_agents():
    done = run_agent("env", env=fake_gpu_env([fake_gpu(0), fake_gpu(1)],
                                             CUDA_VISIBLE_DEVICES="1,0"))
    assert done.returncode == 0, done.stderr
    environment = json.loads(done.stdout)
    assert len(environment["gpus"]) == 2
    assert derived_env_key(environment) == environment["env_key"]
    assert legacy_env_key(environment) == _old_agents_key(environment)
    assert legacy_env_key(environment) != environment["env_key"]  # the index is in it
    swapped = {**environment, "gpus": environment["gpus"][::-1]}
    assert derived_env_key(swapped) == environment["env_key"]
