"""Which nodes may hold one answer on several voters' worth of devices (design §3.3.12).

Every usual answer counts voters (``consensus.in_voters``): each device known by a UUID
or serial is a voter, a node's devices without a stable identity (its CPU, GPUs known
by slot only, claims of another node's devices) are one. Only a node with two or more
such devices can count fewer voters than devices, so the readers ask ``latest`` about
those nodes only: in an honest fleet (GPUs known by UUID, one CPU a node) there are
none, and nothing more is read than ``devices``, a row per device, not per result.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from numparity_server.models import Device, Latest, Node, Outcome, stable_identity


def crowded_nodes(*, per_model: bool = False) -> Select[tuple[int]]:
    """The ids of the nodes with two or more devices without a stable identity (such a
    device is its node's own: its identity names the node, so it is held by the node
    that made it, ``owner_node_id``), as a subquery for ``Latest.node_id.in_``.
    ``per_model``: two or more of one device model, for readers that count each model
    apart (the fleet page's columns, pins): a node's CPU and its one GPU without a UUID
    are then not crowded."""
    node = func.coalesce(Device.owner_node_id, Device.node_id)
    grouped = (node, Device.model) if per_model else (node,)
    return (select(node).where(stable_identity() == 0, node.is_not(None))
            .group_by(*grouped).having(func.count() > 1))


def any_crowded(session: Session, *, per_model: bool = False) -> bool:
    """Whether some node has two or more devices without a stable identity (of one
    model with ``per_model``): none in an honest fleet, where the readers then skip
    ``latest``."""
    return session.scalar(select(crowded_nodes(per_model=per_model).exists())) or False


def crowded_answers(session: Session, *, suite: str, models: Sequence[str] | None = None,
                    environment_ids: Sequence[int] | None = None
                    ) -> list[tuple[str, str, str, str, str, int]]:
    """Where one node holds an ok answer on several devices of one model without a
    stable identity (``stable_identity``): (workload, variant, device model, manifest
    hash, node name, devices), of ``models`` and ``environment_ids`` when given. They
    are one voter (``consensus.in_voters``) to the readers that count each model apart
    (the fleet page's columns, pins); an honest fleet has no such row, and ``latest``
    is read only for the nodes that may (``crowded_nodes``)."""
    if not any_crowded(session, per_model=True):
        return []
    query = (select(Outcome.workload, Outcome.variant, Latest.model, Outcome.manifest_hash,
                    Node.name, func.count())
             .select_from(Latest)
             .join(Device, Device.id == Latest.device_id)
             .join(Outcome, Outcome.id == Latest.outcome_id)
             .join(Node, Node.id == Latest.node_id)
             .where(Latest.node_id.in_(crowded_nodes(per_model=True)), Latest.suite == suite,
                    stable_identity() == 0, Outcome.status == "ok",
                    Outcome.manifest_hash.is_not(None))
             .group_by(Outcome.workload, Outcome.variant, Latest.model,
                       Outcome.manifest_hash, Node.name)
             .having(func.count() > 1))
    if models is not None:
        query = query.where(Latest.model.in_(sorted(set(models))))
    if environment_ids is not None:
        query = query.where(Latest.environment_id.in_(sorted(set(environment_ids))))
    return [(workload, variant, model, manifest, node, int(devices))
            for workload, variant, model, manifest, node, devices in session.execute(query)]
