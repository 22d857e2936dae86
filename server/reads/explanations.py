"""What `explain` found (design §2.11), as every reader shows it: the list of
``GET /explanations`` and the findings beside a split (``explanations_among`` for
``/compare``, ``explanations_of_key`` for ``/divergence`` and the workload page,
``explanations_between`` for two named sides). A split is between nodes: the findings
beside one are those of target "run"; an eager-target finding (a compiled result against
its own run's eager answer) is listed, never shown beside a split.

Here rather than in the ``explain`` domain because several domains read it: a service of
one domain never imports another's (design §7), and ``explain`` itself reads through
here, so there is one answer to "is this finding still current" (``stale``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session, aliased

from numparity_server.analysis.claims import Verified, looks_like_command, verify_setting
from numparity_server.kit.db import chunked
from numparity_server.models import Environment, Explanation, Node, Run

Status = Literal["reproduced", "already", "not_reproduced", "failed"]
# What a finding's reference is: another run's result (the findings beside a split), or
# the same run's eager answer for a compiled result (design §2.14).
Target = Literal["run", "eager"]
TARGET_RUN, TARGET_EAGER = "run", "eager"
KnobValue = bool | int | float | str | None


class SettingOut(BaseModel):
    """Environment variables (null: unset) and knobs, as `explain` applied them."""

    env: dict[str, str | None]
    knobs: dict[str, KnobValue]


class ClosestOut(BaseModel):
    """The candidate that came nearest when none reproduced the reference."""

    label: str
    setting: SettingOut
    matching: int = Field(description="tensors the same as the reference's")
    tensors: int = Field(description="tensors of the reference's result")
    first_differing: str | None = Field(description="the first tensor that is not the same")


class ExplanationOut(BaseModel):
    """One finding: ``node`` (on ``local_device``) against result (suite, workload,
    variant, device) of run ``against_run`` of node ``against_node``."""

    node: str
    target: Target = Field(description="run: under `setting` the node gives run "
                                       "`against_run`'s bits; eager: under `setting` the "
                                       "node's compiled result gives that run's eager "
                                       "(default) answer (design §2.14)")
    against_node: str
    against_run: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str = Field(description="the reference result's device")
    local_device: str = Field(description="the device the explaining node computed on")
    status: Status = Field(description="reproduced: under `setting` the node gives the "
                                       "reference's bits; already: it does as configured; "
                                       "not_reproduced: no candidate did (see `closest`); "
                                       "failed: it could not tell (`detail`)")
    label: str | None = Field(description="`setting` in words: `MKL_CBWR=COMPATIBLE`")
    setting: SettingOut | None
    tried: int = Field(description="settings tried")
    seconds: float
    closest: ClosestOut | None
    detail: str | None
    created_at: datetime
    stale: bool = Field(description="the explaining node's environment has changed since: "
                                    "the finding may no longer hold")
    claimed_by: str = Field(description="who made the finding: the explaining node, whose "
                                        "agent token sent it (a claim, not the server's)")
    verified: Verified = Field(description="what the server could check: whether `setting` "
                                           "appears in the reference run's recorded "
                                           "environment (design §3.3.17)")
    verification: str = Field(description="`verified` in words")
    text_looks_like_command: bool = Field(
        description="`label` or `detail` (the node's text) reads like a shell command: "
                    "shown marked, never to be run")


_node = aliased(Node, name="explaining_node")
_against = aliased(Node, name="against_node")


def _select() -> Select[Any]:
    return (
        select(Explanation, _node.name, _node.environment_id, _against.name, Run.run_id,
               Environment.document)
        .join(_node, _node.id == Explanation.node_id)
        .join(_against, _against.id == Explanation.against_node_id)
        .join(Run, Run.id == Explanation.against_run_pk)
        .outerjoin(Environment, Environment.id == Run.environment_id)
    )


def _out(row: Any) -> ExplanationOut:
    found: Explanation
    found, node, environment_id, against_node, against_run, reference_environment = row
    if found.target == TARGET_RUN:
        verified, verification = verify_setting(found.setting, reference_environment)
    else:
        # An Inductor setting that restores eager's bits is nothing the run recorded.
        verified, verification = ("unchecked", "which setting restores eager's bits is the "
                                  "explaining node's word only")
    return ExplanationOut(
        node=node, target=found.target, against_node=against_node,
        against_run=against_run, suite=found.suite,
        workload=found.workload, workload_version=found.workload_version,
        variant=found.variant, device=found.device, local_device=found.local_device,
        status=found.status,
        label=found.label,
        setting=None if found.setting is None else SettingOut.model_validate(found.setting),
        tried=found.tried, seconds=found.seconds,
        closest=None if found.closest is None else ClosestOut.model_validate(found.closest),
        detail=found.detail, created_at=found.created_at,
        # The node's environment is its newest run's; a finding made on another one
        # describes a node that is no longer there. Unknown (NULL) is not called stale.
        stale=found.environment_id is not None and environment_id != found.environment_id,
        claimed_by=node, verified=verified, verification=verification,
        text_looks_like_command=looks_like_command(found.detail)
        or looks_like_command(found.label),
    )


def _newest_first(query: Select[Any]) -> Select[Any]:
    return query.order_by(Explanation.created_at.desc(), Explanation.id.desc())


def list_explanations(
    session: Session, *, node: str | None = None, against_node: str | None = None,
    workload: str | None = None, variant: str | None = None, target: str | None = None,
    limit: int, offset: int,
) -> tuple[int, list[ExplanationOut]]:
    """(how many match, a page of them newest first)."""
    query = _select()
    if target is not None:
        query = query.where(Explanation.target == target)
    if node is not None:
        query = query.where(_node.name == node)
    if against_node is not None:
        query = query.where(_against.name == against_node)
    if workload is not None:
        query = query.where(Explanation.workload == workload)
    if variant is not None:
        query = query.where(Explanation.variant == variant)
    total = session.scalar(
        select(func.count()).select_from(query.with_only_columns(Explanation.id).subquery())
    ) or 0
    rows = session.execute(_newest_first(query).limit(limit).offset(offset)).all()
    return total, [_out(row) for row in rows]


def explanations_between(
    *, session: Session, suite: str, workload: str, variant: str,
    nodes_a: Collection[str], nodes_b: Collection[str], limit: int = 10,
) -> list[ExplanationOut]:
    """The findings beside a split of (suite, workload, variant) between the nodes of
    ``nodes_a`` and those of ``nodes_b``: the newest per (node, against_node) where the
    node is on one side and the reference run's node on the other (either way round),
    newest first, at most ``limit``.

    The newest per pair is ranked in the database (a window over the key's findings,
    which the (suite, workload, variant) index finds); the explaining node is matched in
    chunks of names, so groups of thousands of nodes stay within any backend's bound on
    parameters, and the reference's side is checked here. One query per 500 nodes.
    """
    side_a, side_b = set(nodes_a), set(nodes_b)
    if not side_a or not side_b or limit < 1:
        return []
    ranked = _ranked_of_key(suite, workload, variant)
    found: list[ExplanationOut] = []
    for names in chunked(sorted(side_a | side_b)):
        newest = (ranked.join(Node, Node.id == Explanation.node_id)
                  .where(Node.name.in_(names)).subquery())
        rows = session.execute(_newest_first(
            _select().join(newest, newest.c.id == Explanation.id).where(newest.c.rank == 1)
        )).all()
        found.extend(out for out in map(_out, rows) if _across(out, side_a, side_b))
    found.sort(key=lambda out: out.created_at, reverse=True)  # stable: ties keep id order
    return found[:limit]


def explanations_of_key(*, session: Session, suite: str, workload: str, variant: str
                        ) -> list[ExplanationOut]:
    """Every finding of (suite, workload, variant), the newest per (node, against_node),
    newest first: /divergence matches them to its groups by the nodes' answers, so a
    group of 100,000 nodes is not sent to the database as names."""
    newest = _ranked_of_key(suite, workload, variant).subquery()
    rows = session.execute(_newest_first(
        _select().join(newest, newest.c.id == Explanation.id).where(newest.c.rank == 1)
    )).all()
    return [_out(row) for row in rows]


def _ranked_of_key(suite: str, workload: str, variant: str) -> Any:
    """The key's findings (its index finds them), ranked newest first per (node,
    against_node): rank 1 is the newest of each pair."""
    return (
        select(Explanation.id.label("id"), func.row_number().over(
            partition_by=(Explanation.node_id, Explanation.against_node_id),
            order_by=(Explanation.created_at.desc(), Explanation.id.desc()),
        ).label("rank"))
        .where(Explanation.suite == suite, Explanation.workload == workload,
               Explanation.variant == variant, Explanation.target == TARGET_RUN)
    )


def _across(out: ExplanationOut, side_a: set[str], side_b: set[str]) -> bool:
    return ((out.node in side_a and out.against_node in side_b)
            or (out.node in side_b and out.against_node in side_a))


Key = tuple[str, str, str]  # (suite, workload, variant)


def explanations_among(
    *, session: Session, nodes: Collection[str], keys: Collection[Key] | None = None,
) -> dict[Key, list[ExplanationOut]]:
    """Per (suite, workload, variant), the newest finding of each (node, against_node)
    with both among ``nodes``, newest first; only ``keys`` when given. What `/compare`
    (two runs' nodes, every key at once) shows beside a split: one query per 500 nodes,
    whatever the keys."""
    names = set(nodes)
    if not names:
        return {}
    partition = (Explanation.node_id, Explanation.against_node_id, Explanation.suite,
                 Explanation.workload, Explanation.variant)
    found: dict[Key, list[ExplanationOut]] = {}
    for chunk in chunked(sorted(names)):
        ranked = select(Explanation.id.label("id"), func.row_number().over(
            partition_by=partition,
            order_by=(Explanation.created_at.desc(), Explanation.id.desc()),
        ).label("rank")).join(Node, Node.id == Explanation.node_id).where(
            Node.name.in_(chunk), Explanation.target == TARGET_RUN)
        if keys is not None and len({key[1] for key in keys}) == 1:
            # One workload (the /divergence case): let the (suite, workload, variant)
            # index narrow the window.
            ranked = ranked.where(Explanation.workload == next(iter(keys))[1])
        newest = ranked.subquery()
        rows = session.execute(_newest_first(
            _select().join(newest, newest.c.id == Explanation.id).where(newest.c.rank == 1)
        )).all()
        for out in map(_out, rows):
            key = (out.suite, out.workload, out.variant)
            if out.against_node in names and (keys is None or key in keys):
                found.setdefault(key, []).append(out)
    for outs in found.values():
        outs.sort(key=lambda out: out.created_at, reverse=True)
    return found


# The eager-target findings read for one run at most (`explain` run again adds rows).
MAX_EAGER_FINDINGS = 500


def eager_findings(*, session: Session, run_pk: int
                   ) -> dict[tuple[str, str, str], ExplanationOut]:
    """Per (suite, workload, device) of run ``run_pk``'s compiled results, the newest
    finding of ``explain --target eager`` against it: which Inductor setting restores
    that run's eager answer (design §2.14). One query, of the newest 500 rows."""
    rows = session.execute(_newest_first(
        _select().where(Explanation.against_run_pk == run_pk,
                        Explanation.target == TARGET_EAGER)
    ).limit(MAX_EAGER_FINDINGS)).all()
    found: dict[tuple[str, str, str], ExplanationOut] = {}
    for out in map(_out, rows):
        found.setdefault((out.suite, out.workload, out.device), out)
    return found
