"""Op sequences aligned in bounded work (analysis.alignment, issue 30 finding 1): the pairs
are equal signatures running forward on both sides, as many as a known longest common
subsequence where the case has one, and no pair of 50,000-op sequences takes more than
the work budget; past it the answer says up to which op it aligned."""

from __future__ import annotations

import random

import pytest

from numparity_server.analysis import alignment, origin_ops
from numparity_server.analysis.alignment import WORK_BUDGET, align
from numparity_server.analysis.trace import Trace, TraceOp

N = 50_000  # the most ops a trace may have (runs.schemas.MAX_OPS_PER_TRACE)


def valid(a, b, pairs):
    steps = zip(pairs, pairs[1:], strict=False)
    return (all(a[i] == b[j] for i, j in pairs)
            and all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in steps))


def blocks(count):
    out = []
    for k in range(count):
        out += [k] * (k % 7 + 1)
    return out


_rng = random.Random(30)
CASES = {
    # Neighbours swapped: the longest common subsequence is every other op. (Before:
    # SequenceMatcher recursed once per pair, each time over the whole rest: 165 s.)
    "swapped neighbours": (list(range(N)), [i ^ 1 for i in range(N)], N // 2),
    "reversed": (list(range(N)), list(range(N))[::-1], 1),
    "one op inserted": (list(range(N)), [*range(N // 2), -1, *range(N // 2, N)], N),
    "one op replaced in each block of 7": (
        list(range(N)), [-1 if i % 7 == 3 else i for i in range(N)], N - len(range(3, N, 7))),
    "four signatures at random": ([_rng.randrange(4) for _ in range(N)],
                                  [_rng.randrange(4) for _ in range(N)], None),
    "shuffled": (list(range(N)), _rng.sample(range(N), N), None),
    "blocks of repeats, reversed": (blocks(300) * 20, blocks(300)[::-1] * 20, None),
    "unique ops between swapped repeats": (
        [v for k in range(N // 3) for v in (10**6 + k, 1, 2)],
        [v for k in range(N // 3) for v in (10**6 + k, 2, 1)], 2 * (N // 3)),
}


@pytest.mark.parametrize("case", CASES)
def test_sequences_of_any_shape_align_within_the_budget(case):
    a, b, longest = CASES[case]
    found = align(a, b)
    assert found.through is None, case
    assert found.work <= WORK_BUDGET
    assert valid(a, b, found.pairs)
    if longest is not None:
        assert len(found.pairs) == longest


def test_past_the_budget_the_alignment_says_where_it_stopped():
    a, b, _ = CASES["swapped neighbours"]
    found = align(a, b, budget=400_000)
    assert found.through is not None and 0 < found.through < N
    assert found.work <= 400_000
    assert valid(a, b, found.pairs)
    assert all(i < found.through for i, _j in found.pairs)
    # As far as it went, as many pairs as the whole alignment has there.
    whole = align(a, b)
    assert found.pairs == [(i, j) for i, j in whole.pairs if i < found.through]


def op(name: str, out: str, inputs: tuple[str, ...] = ("x",)) -> TraceOp:
    return TraceOp(f"aten.{name}.default", name, "forward", inputs, (out,))


def test_origin_ops_name_the_op_the_alignment_reached(monkeypatch):
    """Two 2,000-op traces whose neighbours are swapped, each op an origin (same input,
    other output): with a budget that covers part of them, the answer counts the origins
    of the ops aligned and says from which op on nothing was."""
    names = [f"op{k}" for k in range(2000)]
    a = Trace("a", {}, tuple(op(name, f"a{k}") for k, name in enumerate(names)))
    b = Trace("b", {}, tuple(op(names[k ^ 1], f"b{k ^ 1}") for k in range(2000)))
    complete = origin_ops(a, b)
    assert complete.aligned_up_to is None and complete.count == complete.aligned == 1000
    monkeypatch.setattr(alignment, "WORK_BUDGET", 12_000)
    cut = origin_ops(a, b)
    assert cut.aligned_up_to is not None and 0 < cut.aligned_up_to < 2000
    assert cut.count == cut.aligned < 1000
    assert all(found.seq_a < cut.aligned_up_to for found in cut.listed)
    assert cut.to_dict()["aligned_up_to"] == cut.aligned_up_to
