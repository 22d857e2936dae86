"""The fleet against the lab's policy: each node judged on its current environment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .environment import flatten_environment
from .policy import Policy, Violation


def fleet_violations(policy: Policy, node_env: Mapping[str, int],
                     documents: Mapping[int, Mapping[str, Any]]
                     ) -> list[tuple[str, int, Violation]]:
    """``(node, environment, violation)``, by node, for ``node_env`` (node → its current
    environment) and each environment's document. Each environment is judged once."""
    if not policy.allowed and not policy.required:
        return []
    per_env = {env_id: policy.violations(flatten_environment(documents[env_id]))
               for env_id in set(node_env.values())}
    return [(node, env_id, violation) for node, env_id in sorted(node_env.items())
            for violation in per_env[env_id]]
