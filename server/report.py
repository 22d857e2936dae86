"""Plain-text rendering of a `/api/v1/divergence` answer (the demo's report)."""

from __future__ import annotations

from typing import Any


def _number(value: Any, *, whole: bool = False) -> str:
    if value is None:
        return "n/a"
    if whole:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _separation(item: dict[str, Any]) -> str:
    """"MKL_CBWR (unset vs COMPATIBLE)"; long texts such as parallel_info are only named."""
    sides = ["/".join(item["a"]), "/".join(item["b"])]
    if any("\n" in side or len(side) > 40 for side in sides):
        return f"{item['attribute']} (differs)"
    return f"{item['attribute']} ({sides[0]} vs {sides[1]})"


def format_divergence(payload: dict[str, Any]) -> str:
    """Render groups, pairwise verdicts and attribution as lines a person reads."""
    key = payload["key"]
    lines = [
        f"== {key['workload']} / {key['variant']} — tensor {key['tensor']!r} "
        f"(suite {key['suite']}, version {key['workload_version']})"
    ]
    groups = payload["groups"]
    if len(groups) == 1:
        lines.append(f"  all {groups[0]['size']} nodes agree bit for bit")
    for group in groups:
        noun = "node " if group["size"] == 1 else "nodes"
        lines.append(
            f"  group {group['id']}: {group['size']} {noun} {', '.join(group['nodes'])}"
        )
    for pair in payload["pairs"]:
        metrics = pair.get("metrics") or {}
        lines.append(
            f"  group {pair['a']} vs {pair['b']}: {pair['verdict']}"
            f" (max abs {_number(metrics.get('max_abs'))},"
            f" max rel {_number(metrics.get('max_rel'))},"
            f" max ULP {_number(metrics.get('max_ulp'), whole=True)}; from {pair['basis']})"
        )
        layer = pair.get("first_divergent_layer")
        if layer:
            lines.append(f"    first divergent layer: {layer['name']}")
        attribution = pair.get("attribution") or []
        if not attribution:
            lines.append("    no recorded environment attribute separates these groups")
            continue
        explained = "; ".join(_separation(item) for item in attribution)
        lines.append(f"    explained by: {explained}")
        if pair.get("indistinguishable"):
            lines.append("    (they go together in this fleet: it cannot tell them apart)")
    if payload.get("members_without_tensor"):
        missing = ", ".join(payload["members_without_tensor"])
        lines.append(f"  without this tensor: {missing}")
    return "\n".join(lines)
