"""The fleet against the lab's policy: each node judged on its current environment."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from .environment import flatten_environment
from .numerics import check_holds
from .policy import Policy, Violation


def fleet_violations(policy: Policy, node_env: Mapping[str, int],
                     documents: Mapping[int, Mapping[str, Any]]
                     ) -> list[tuple[str, int, Violation]]:
    """``(node, environment, violation)``, by node, for ``node_env`` (node → its current
    environment) and each environment's document. Each environment is judged once."""
    per_env = environment_violations(policy, {
        env_id: flatten_environment(documents[env_id]) for env_id in set(node_env.values())})
    return [(node, env_id, violation) for node, env_id in sorted(node_env.items())
            for violation in per_env.get(env_id, [])]


def environment_violations(policy: Policy, flattened: Mapping[int, Mapping[str, str]]
                           ) -> dict[int, list[Violation]]:
    """The violations of each environment (by id, flattened) that has some: every node
    on it has them."""
    if not policy.allowed and not policy.required:
        return {}
    found = {env_id: policy.violations(flat) for env_id, flat in flattened.items()}
    return {env_id: violations for env_id, violations in found.items() if violations}


def broken_requirements(required_checks: Mapping[str, bool], workload: str,
                        checks: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
    """The ``workload.check`` requirements one outcome's checks break (a check it does
    not report breaks none: a node is judged on what it ran)."""
    found = []
    for key, wanted in required_checks.items():
        named, _, check = key.rpartition(".")
        held = check_holds(checks, check) if named == workload else None
        if held is not None and held != wanted:
            found.append(key)
    return found


def check_violations(required_checks: Mapping[str, bool],
                     held: Iterable[tuple[str, int, str, str, Mapping[str, Any] | None]]
                     ) -> list[tuple[str, int, Violation]]:
    """``(node, environment, violation)`` for each node and ``workload.check``
    requirement its latest results break, from ``(node, environment, workload, variant,
    checks)``: the value names the variants and where the check breaks."""
    broken: dict[tuple[str, int, str], list[tuple[str, str | None]]] = defaultdict(list)
    for node, env_id, workload, variant, checks in held:
        for key in broken_requirements(required_checks, workload, checks):
            op = (checks or {}).get(key.rpartition(".")[2], {}).get("op")
            broken[(node, env_id, key)].append((variant, op))
    found = []
    for (node, env_id, key), where in sorted(broken.items()):
        wanted = required_checks[key]
        ops = sorted({op for _, op in where if op})
        value = (f"{_render_bool(not wanted)} under {', '.join(sorted(v for v, _ in where))}"
                 + (f" (at {', '.join(ops)})" if ops else ""))
        found.append((node, env_id, Violation(key, value, "required",
                                              (_render_bool(wanted),))))
    return found


def _render_bool(value: bool) -> str:
    return "true" if value else "false"
