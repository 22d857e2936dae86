"""What the fleet has run: suites, workloads, variants and tensor names, from the
outcomes of the newest results and their manifests (never the whole history)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from urllib.parse import quote, urlencode

from sqlalchemy.orm import Session

from numparity_server.catalog import repository
from numparity_server.catalog.repository import SeenOutcome
from numparity_server.catalog.schemas import SuitesPage, TensorSeen, VariantSeen, WorkloadSeen
from numparity_server.kit.errors import NotFound
from numparity_server.reads.results import manifest_entries

# The display order of variants (design §2.3 lists them; the agent runs fp64-reference
# last, it is shown third, beside strict); others follow alphabetically.
VARIANT_ORDER = ("default", "strict", "fp64-reference", "tf32", "fp16-autocast",
                 "bf16-autocast", "compiled")


def variant_sort_key(variant: str) -> tuple[int, str]:
    order = VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)
    return order, variant


def workload_url(suite: str, workload: str) -> str:
    return f"/workloads/{quote(workload, safe='')}?" + urlencode({"suite": suite})


def suites(*, session: Session, suite: str | None, limit: int, offset: int) -> SuitesPage:
    """A page of the workloads of every suite (or of ``suite``), by suite then name."""
    names = repository.suites(session)
    if suite is not None and suite not in names:
        raise NotFound(f"no node has results in suite {suite!r}; suites: "
                       f"{', '.join(names) or 'none yet'}")
    by_workload: dict[tuple[str, str], list[SeenOutcome]] = defaultdict(list)
    for outcome in repository.seen_outcomes(session, suite=suite):
        by_workload[(outcome.suite, outcome.workload)].append(outcome)
    keys = sorted(by_workload)
    shown = keys[offset:offset + limit]
    entries = manifest_entries(session, {o.manifest_hash for key in shown
                                         for o in by_workload[key] if _ok(o)})
    items = [_workload(key, by_workload[key], entries) for key in shown]
    return SuitesPage(items=items, total=len(keys), limit=limit, offset=offset, suites=names)


def tensors(*, session: Session, suite: str, workload: str) -> list[TensorSeen]:
    """The tensor names and kinds of ``workload``'s ok newest results (see ``_tensors``)."""
    outcomes = repository.seen_outcomes(session, suite=suite, workload=workload)
    entries = manifest_entries(session, {o.manifest_hash for o in outcomes if _ok(o)})
    return _tensors(outcomes, entries)


def _ok(outcome: SeenOutcome) -> bool:
    return outcome.status == "ok" and outcome.manifest_hash is not None


def _workload(key: tuple[str, str], outcomes: Sequence[SeenOutcome],
              entries: dict[str, list[dict[str, str]]]) -> WorkloadSeen:
    suite, workload = key
    by_variant: dict[str, list[SeenOutcome]] = defaultdict(list)
    for outcome in outcomes:
        by_variant[outcome.variant].append(outcome)
    variants = []
    for variant in sorted(by_variant, key=variant_sort_key):
        held = by_variant[variant]
        statuses: dict[str, int] = defaultdict(int)
        for outcome in held:
            statuses[outcome.status] += outcome.nodes
        ok = [o for o in held if _ok(o)]
        variants.append(VariantSeen(
            variant=variant, nodes=sum(o.nodes for o in held), statuses=dict(statuses),
            devices=sorted({o.device.partition(":")[0] for o in ok}),
            versions=sorted({o.workload_version for o in ok if o.workload_version is not None}),
            divergence=("/api/v1/divergence?" + urlencode(
                {"suite": suite, "workload": workload, "variant": variant})) if ok else None))
    return WorkloadSeen(
        suite=suite, workload=workload,
        versions=sorted({o.workload_version for o in outcomes
                         if _ok(o) and o.workload_version is not None}),
        variants=variants, tensors=_tensors(outcomes, entries),
        page=workload_url(suite, workload))


def _tensors(outcomes: Sequence[SeenOutcome], entries: dict[str, list[dict[str, str]]]
             ) -> list[TensorSeen]:
    """Every (name, kind) of the ok outcomes' manifests, each once, in execution order:
    manifests of the newest version first, then by variant (default first) and by how
    many nodes hold them, so a name keeps the position the usual answer gives it."""
    ordered = sorted((o for o in outcomes if _ok(o)), key=lambda o: (
        -(o.workload_version or 0), variant_sort_key(o.variant), -o.nodes,
        o.manifest_hash or ""))
    seen: dict[tuple[str, str], None] = {}
    for outcome in ordered:
        for entry in entries.get(outcome.manifest_hash or "", []):
            seen.setdefault((entry["name"], entry["kind"]), None)
    return [TensorSeen(name=name, kind=kind) for name, kind in seen]
