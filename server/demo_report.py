"""Plain-text rendering of `/api/v1/divergence` and `/api/v1/audit` answers (the demo)."""

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
    """"MKL_CBWR (unset vs COMPATIBLE)"; of a long text such as torch.config the part that
    differs ("line 3: …CUDA 12.1… vs line 3: …CUDA 12.4…"); several values only named."""
    if "a_short" in item:
        return f"{item['attribute']} ({item['a_short']} vs {item['b_short']})"
    sides = ["/".join(item["a"]), "/".join(item["b"])]
    if any("\n" in side or len(side) > 40 for side in sides):
        return f"{item['attribute']} (differs)"
    return f"{item['attribute']} ({sides[0]} vs {sides[1]})"


def format_divergence(payload: dict[str, Any]) -> str:
    """Render groups, verdicts and attribution as lines a person reads: each group
    against the largest (group 1); the API has every pair."""
    key = payload["key"]
    lines = [
        f"== {key['workload']} / {key['variant']} — "
        f"{'tensor ' + repr(key['tensor']) if key['tensor'] else 'whole result'} "
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
        if pair["a"] != groups[0]["id"]:
            continue
        metrics = pair.get("metrics") or {}
        if pair.get("evidence"):  # not measured over the whole tensor: say what was seen
            measured = f"{pair['evidence']}; from {pair['basis']}"
        else:
            measured = (f"max abs {_number(metrics.get('max_abs'))},"
                        f" max rel {_number(metrics.get('max_rel'))},"
                        f" max ULP {_number(metrics.get('max_ulp'), whole=True)};"
                        f" from {pair['basis']}")
        decided = f", decided by {pair['decided_by']}" if pair.get("decided_by") else ""
        lines.append(f"  group {pair['a']} vs {pair['b']}: {pair['verdict']}{decided} "
                     f"({measured})")
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


def format_audit(payload: dict[str, Any]) -> str:
    """The audit's summary and its findings, a line each."""
    summary = payload["summary"]
    counts = ", ".join(f"{summary[name]} {name}" for name in
                       ("ok", "suspect", "watch", "nondeterministic", "stale")
                       if summary.get(name))
    lines = [f"== audit: {summary['nodes']} nodes on {summary['environments']} environments "
             f"({counts})"]
    for entry in payload["suspects"]:
        drill = ", a drill" if entry["drill"] else ""
        workloads = ", ".join(sorted({key["workload"] for key in entry["keys"]}))
        lines.append(
            f"  {entry['status']}: {entry['node']} — strict answers of {workloads} differ "
            f"from its {entry['peers']} same-environment peers in "
            f"{entry['disagreeing_runs']} run(s){drill}")
    for entry in payload["nondeterministic"]:
        lines.append(f"  nondeterministic: {entry['node']} — {entry['detail']}")
    for entry in payload["stale"]:
        lines.append(f"  stale: {entry['node']} — no upload for {entry['hours_since']} h")
    for entry in payload["policy"]:
        lines.append(f"  policy: {entry['node']} — {entry['attribute']} is {entry['value']}")
    for entry in payload["broken_inputs"]:
        lines.append(f"  broken inputs: {entry['node']} — {entry['workload']}")
    for entry in payload["determinism_cost"]:
        if entry["ratio"] is not None:
            lines.append(f"  strict costs {entry['ratio']:.2f}x default on "
                         f"{entry['env_key'][:12]} ({entry['nodes']} node(s))")
    if len(lines) == 1:
        lines.append("  nothing to report")
    return "\n".join(lines)
