"""An admin confirms a device's move to another node (design §3.1, §8).

A physical device belongs to the node that reported it first; another node's reports of
it are kept as that node's claim (a device row of its own, ``claim_of`` the owned one)
and change nothing of the owner's record. `numparity-server device move <device> --to
<node>` is the admin saying the GPU really moved: the device then belongs to that node,
the claim's results join the device's history, the old node's latest results of it go
(it is judged by the devices it has) and the device sits on the new node.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from numparity_server.kit.db import writing
from numparity_server.kit.errors import BadRequest, NotFound
from numparity_server.models import Device, Latest, Node, Result, utcnow
from numparity_server.runs import counts
from numparity_server.runs.devices import normal_uuid


@dataclass(frozen=True)
class DeviceMove:
    identity: str
    from_node: str | None  # the owner before
    to_node: str
    claimed_results: int  # the claim's results that joined the device's history


@dataclass(frozen=True)
class DeviceClaim:
    identity: str
    owner: str | None
    claimed_by: str
    slot: str
    results: int
    last_seen: str


def _find_device(session: Session, device: str) -> Device:
    """The owned device ``device`` names: its identity (``uuid:…``, ``serial:…``), its
    UUID (with or without ``GPU-``) or its serial."""
    if device.startswith(("uuid:", "serial:")):
        wanted = [device]
    else:
        wanted = [f"uuid:{normal_uuid(device)}", f"uuid:{device}", f"serial:{device}"]
    found = session.scalars(select(Device).where(Device.identity.in_(wanted),
                                                 Device.claim_of.is_(None))).all()
    if not found:
        raise NotFound(f"no device {device!r} (give a GPU UUID, a serial, or an identity "
                       "uuid:… / serial:…)")
    if len(found) > 1:
        raise BadRequest(f"{device!r} names {len(found)} devices: "
                         f"{', '.join(sorted(d.identity for d in found))}; give one identity")
    return found[0]


def list_claims(*, session: Session) -> list[DeviceClaim]:
    """Every claim waiting for an admin: the device, its owner, the claiming node."""
    claims = []
    rows = session.execute(select(Device).where(Device.claim_of.is_not(None))
                           .order_by(Device.id)).scalars().all()
    for claim in rows:
        owned = session.get(Device, claim.claim_of)
        owner = session.get(Node, owned.owner_node_id) if owned and owned.owner_node_id else None
        by = session.get(Node, claim.owner_node_id) if claim.owner_node_id else None
        results = len(session.scalars(select(Result.id).where(Result.device_id == claim.id)
                                      .limit(10_000)).all())
        claims.append(DeviceClaim(identity=owned.identity if owned else "?",
                                  owner=owner.name if owner else None,
                                  claimed_by=by.name if by else "?", slot=claim.slot,
                                  results=results, last_seen=claim.last_seen.isoformat()))
    return claims


def move_device(*, session: Session, device: str, to_node: str) -> DeviceMove:
    """``device`` belongs to ``to_node`` from now on (the admin confirms the claim, or
    moves a device no node has claimed yet)."""
    with writing(session):
        owned = _find_device(session, device)
        target = session.scalar(select(Node).where(Node.name == to_node))
        if target is None:
            raise NotFound(f"no node {to_node!r}")
        previous = session.get(Node, owned.owner_node_id) if owned.owner_node_id else None
        claim = session.scalar(select(Device).where(Device.claim_of == owned.id,
                                                    Device.owner_node_id == target.id))
        # Nodes whose latest rows change: the one it sits on (its rows of it go) and the
        # new one (its claim's rows become rows of the device).
        touched = sorted({pk for pk in (owned.node_id, target.id) if pk is not None})
        before = {pk: counts.node_rows(session, pk) for pk in touched}
        # The device's latest rows of other nodes go; a claim's rows take their place.
        gone = delete(Latest).where(Latest.device_id == owned.id)
        session.execute(gone if claim is not None else gone.where(Latest.node_id != target.id))
        moved_results = 0
        now = utcnow()
        if claim is not None:
            session.execute(update(Latest).where(Latest.device_id == claim.id)
                            .values(device_id=owned.id))
            updated = session.execute(
                update(Result).where(Result.device_id == claim.id).values(device_id=owned.id))
            moved_results = int(getattr(updated, "rowcount", 0) or 0)
            newest = max((t for t in (owned.newest_started_at, claim.newest_started_at)
                          if t is not None), default=None)
            owned.slot, owned.newest_started_at = claim.slot, newest
            owned.last_seen = max(owned.last_seen, claim.last_seen)
            session.delete(claim)  # other nodes' claims stay claims, against the new owner
            session.flush()
        held = session.scalar(select(Latest.id).where(Latest.device_id == owned.id,
                                                      Latest.node_id == target.id).limit(1))
        owned.owner_node_id = target.id
        owned.node_id = target.id if held is not None else None
        owned.moved_at = now
        session.flush()
        for pk in touched:
            node_name = session.get(Node, pk).name  # type: ignore[union-attr]
            counts.move(session, node=node_name, before=before[pk],
                        after=counts.node_rows(session, pk))
        return DeviceMove(identity=owned.identity,
                          from_node=previous.name if previous else None,
                          to_node=target.name, claimed_results=int(moved_results))
