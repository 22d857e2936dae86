"""Content-addressed storage (design §3.1): stored once per hash, like git's objects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, UTCDateTime, utcnow


class Manifest(Base):
    """A result's ordered tensors: ``entries`` = [{"name", "kind", "hash"}, ...].

    ``hash`` is the sha256 of the canonical JSON of the ordered (name, kind, hash)
    triples, so every node that produced the same tensors shares one row.
    """

    __tablename__ = "manifests"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    entries: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    tensor_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Fingerprint(Base):
    """Everything about a tensor that is a function of its bytes (design §2.4).

    Arrays are kept as their raw little-endian wire bytes with their dtype; ``values``
    has the tensor's shape, ``sketch`` k and ``sample`` m elements.
    """

    __tablename__ = "fingerprints"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    dtype: Mapped[str] = mapped_column(String(32))
    shape: Mapped[list[int]] = mapped_column(JSON)
    count: Mapped[int | None] = mapped_column(BigInteger)
    nan: Mapped[int | None] = mapped_column(BigInteger)
    inf: Mapped[int | None] = mapped_column(BigInteger)
    # +Inf and -Inf apart (agents that send pos_inf/neg_inf, migration 0005; None from older ones).
    pos_inf: Mapped[int | None] = mapped_column(BigInteger)
    neg_inf: Mapped[int | None] = mapped_column(BigInteger)
    zero: Mapped[int | None] = mapped_column(BigInteger)
    subnormal: Mapped[int | None] = mapped_column(BigInteger)
    fp16_overflow: Mapped[int | None] = mapped_column(BigInteger)
    fp16_underflow: Mapped[int | None] = mapped_column(BigInteger)
    min: Mapped[float | None] = mapped_column(Float)
    max: Mapped[float | None] = mapped_column(Float)
    mean: Mapped[float | None] = mapped_column(Float)
    std: Mapped[float | None] = mapped_column(Float)
    abs_max: Mapped[float | None] = mapped_column(Float)
    l2: Mapped[float | None] = mapped_column(Float)
    sketch: Mapped[bytes | None] = mapped_column(LargeBinary)
    sketch_dtype: Mapped[str | None] = mapped_column(String(32))
    sample: Mapped[bytes | None] = mapped_column(LargeBinary)
    sample_dtype: Mapped[str | None] = mapped_column(String(32))
    values: Mapped[bytes | None] = mapped_column(LargeBinary)
    values_dtype: Mapped[str | None] = mapped_column(String(32))
    # None: ``values`` are the raw bytes; "zlib": compressed (the full values of a large
    # tensor, sent on the server's request, design §2.8, "no blind spots").
    values_codec: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Trace(Base):
    """An op trace of one result (the agent's ``run --trace-ops``): every aten operation in
    execution order, its tensors named by the first 16 hex digits of their hashes.

    ``body`` is the zlib of the canonical JSON the hash covers (the trace without its
    ``hash``: sorted keys, compact, as the agent computes it), so a stored body checks
    against its own key. Traces of every node of an environment are alike, so a steady
    fleet stores each once (design §3.1).
    """

    __tablename__ = "traces"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    op_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


STAT_FIELDS = ("count", "nan", "inf", "pos_inf", "neg_inf", "zero", "subnormal",
               "fp16_overflow", "fp16_underflow", "min", "max", "mean", "std", "abs_max", "l2")
