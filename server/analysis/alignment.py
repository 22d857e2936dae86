"""Two op sequences aligned in bounded work (design §3.3.14).

The ops of two traces are paired by signature (``trace.Signature``), in order on both
sides. Traces that run the same sequence pair one to one, and so do their common head
and common tail. Between them, the middle is split at **anchors**, signatures that occur
exactly once in each side's stretch (the modules' paths make most ops of a model unique):
the longest chain of anchors running forward on both sides (patience sorting, n log n)
pairs them, and each stretch between two anchors is aligned the same way, its own common
head and tail first. A stretch small enough (``SMALL``: the product of its two lengths)
goes to ``difflib.SequenceMatcher`` (autojunk off), which finds the longest matching
blocks; a large one without anchors (long runs of few distinct signatures, a backward
pass of identical layers) pairs the k-th op of a signature on one side with the k-th on
the other, keeping the longest chain that runs forward on both (n log n).

Stretches are taken left to right, and every step is counted (elements scanned, pairs
of a small stretch) against ``WORK_BUDGET``. SequenceMatcher alone on the middle took
time in the square of its length (50,000 swapped neighbours: 165 s); here no pair of
traces costs more than the budget (~1 s of one core). When the budget runs out the
alignment stops where it is: ``Alignment.through`` is the first op of ``a`` left
unaligned, and everything from there on (the common tail included) is left out rather
than guessed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

# Steps one alignment may take (an element scanned or counted, a pair of a small stretch
# compared): 0.3–0.5 s of one core here, 10 times what two 50,000-op traces that part at
# every attention call take.
WORK_BUDGET = 2_500_000
# A stretch whose two lengths multiply to at most this goes to SequenceMatcher: its cost
# is at most about that product, and it finds the longest blocks where anchors would
# only find the unique ops.
SMALL = 16_384
# What taking up a stretch costs besides its elements, in steps of about the same time:
# any stretch, and one that goes to SequenceMatcher (its set-up).
STEP = 40
MATCHER_STEP = 60


@dataclass(frozen=True)
class Alignment:
    """``pairs``: (i, j) positions of equal signatures, increasing on both sides.
    ``parting``: the first position where the sequences differ (None: the same
    sequence). ``through``: None when every op was aligned; else the work budget ran out
    and the ops of ``a`` from ``through`` on were not (no pair has ``i >= through``).
    ``work``: the steps taken."""

    pairs: list[tuple[int, int]]
    parting: int | None
    through: int | None = None
    work: int = 0


class _OutOfWork(Exception):
    """The budget ran out in a stretch; ``at``: its first op of ``a`` not yet paired."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


@dataclass
class _Aligner:
    a: list[int]
    b: list[int]
    budget: int
    work: int = 0
    pairs: list[tuple[int, int]] = field(default_factory=list)

    def spend(self, steps: int, at: int) -> None:
        if self.work + steps > self.budget:
            raise _OutOfWork(at)
        self.work += steps

    def run(self, alo: int, ahi: int, blo: int, bhi: int) -> int | None:
        """Align a[alo:ahi] with b[blo:bhi] into ``pairs``; the first position of ``a``
        left unaligned when the budget runs out, else None."""
        # The stack holds stretches still to align and pairs waiting for the stretches
        # before them: popped in order, so ``pairs`` grows left to right.
        stack: list[tuple[int, int, int, int] | list[tuple[int, int]]] = [(alo, ahi, blo, bhi)]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                self.pairs.extend(item)
                continue
            try:
                self._stretch(*item, stack)
            except _OutOfWork as out:
                return out.at
        return None

    def _stretch(self, alo: int, ahi: int, blo: int, bhi: int,
                 stack: list[tuple[int, int, int, int] | list[tuple[int, int]]]) -> None:
        a, b = self.a, self.b
        self.spend(min(ahi - alo, bhi - blo) + STEP, alo)
        while alo < ahi and blo < bhi and a[alo] == b[blo]:
            self.pairs.append((alo, blo))
            alo, blo = alo + 1, blo + 1
        tail = []
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
            ahi, bhi = ahi - 1, bhi - 1
            tail.append((ahi, bhi))
        if tail:
            stack.append(tail[::-1])
        if alo == ahi or blo == bhi:
            return
        if ahi - alo == 1 or bhi - blo == 1:  # one op against a stretch: its first match
            self.spend((ahi - alo) + (bhi - blo), alo)
            self.pairs.extend(_first_match(a, b, alo, ahi, blo, bhi))
            return
        if (ahi - alo) * (bhi - blo) <= SMALL:
            self.spend(MATCHER_STEP + (ahi - alo) * (bhi - blo), alo)
            matcher = SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
            self.pairs.extend((alo + block.a + k, blo + block.b + k)
                              for block in matcher.get_matching_blocks()
                              for k in range(block.size))
            return
        self.spend(2 * ((ahi - alo) + (bhi - blo)), alo)
        anchors = _anchors(a, b, alo, ahi, blo, bhi)
        if not anchors:
            self.pairs.extend(_by_occurrence(a, b, alo, ahi, blo, bhi))
            return
        # Stretches between the anchors, pushed last first: popped in order.
        edges = [(alo - 1, blo - 1), *anchors, (ahi, bhi)]
        for (i0, j0), (i1, j1) in reversed(list(zip(edges, edges[1:], strict=False))):
            if (i1, j1) != (ahi, bhi):
                stack.append([(i1, j1)])
            if i0 + 1 < i1 and j0 + 1 < j1:
                stack.append((i0 + 1, i1, j0 + 1, j1))


def align(a: Sequence[Hashable], b: Sequence[Hashable], *,
          budget: int | None = None) -> Alignment:
    """Pairs of positions with equal elements (signatures), increasing in both, found in
    at most ``budget`` steps (default ``WORK_BUDGET``); the parting point; where the
    budget ran out, if it did."""
    shorter = min(len(a), len(b))
    part = next((i for i in range(shorter) if a[i] != b[i]), shorter)
    if part == len(a) == len(b):
        return Alignment([(i, i) for i in range(part)], None, None, part)
    # Elements as small integers: they are hashed and compared many times.
    ids: dict[Hashable, int] = {}
    aligner = _Aligner([ids.setdefault(s, len(ids)) for s in a],
                       [ids.setdefault(s, len(ids)) for s in b],
                       WORK_BUDGET if budget is None else budget, work=part)
    aligner.pairs.extend((i, i) for i in range(part))
    through = aligner.run(part, len(a), part, len(b))
    return Alignment(aligner.pairs, part, through, aligner.work)


def _first_match(a: list[int], b: list[int], alo: int, ahi: int, blo: int, bhi: int
                 ) -> list[tuple[int, int]]:
    """The one op of a side (a or b has one op here) paired with its first equal op on the
    other, if any."""
    if ahi - alo == 1:
        j = next((j for j in range(blo, bhi) if b[j] == a[alo]), None)
        return [] if j is None else [(alo, j)]
    i = next((i for i in range(alo, ahi) if a[i] == b[blo]), None)
    return [] if i is None else [(i, blo)]


def _anchors(a: list[int], b: list[int], alo: int, ahi: int, blo: int, bhi: int
             ) -> list[tuple[int, int]]:
    """The longest chain, forward on both sides, of the elements that occur once in
    a[alo:ahi] and once in b[blo:bhi]."""
    once_b = _unique(b, blo, bhi)
    # _unique keeps the order of a: the candidates increase in a's position.
    candidates = [(i, once_b[s]) for s, i in _unique(a, alo, ahi).items() if s in once_b]
    return _longest_chain(candidates)


def _unique(values: list[int], lo: int, hi: int) -> dict[int, int]:
    """Element -> its position, of the elements that occur once in values[lo:hi]."""
    counts = Counter(values[lo:hi])
    return {s: lo + k for k, s in enumerate(values[lo:hi]) if counts[s] == 1}


def _by_occurrence(a: list[int], b: list[int], alo: int, ahi: int, blo: int, bhi: int
                   ) -> list[tuple[int, int]]:
    """The k-th of each element in a[alo:ahi] with the k-th in b[blo:bhi], then the
    longest chain of those pairs increasing in b's position too."""
    where: defaultdict[int, list[int]] = defaultdict(list)
    for j in range(blo, bhi):
        where[b[j]].append(j)
    seen: Counter[int] = Counter()
    candidates = []
    for i in range(alo, ahi):
        s = a[i]
        k = seen[s]
        seen[s] += 1
        if k < len(where[s]):
            candidates.append((i, where[s][k]))
    return _longest_chain(candidates)


def _longest_chain(candidates: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Of pairs increasing in their first position, the longest chain increasing in the
    second too (patience sorting)."""
    # tails[n]: the smallest b position ending a chain of n + 1 pairs; chain links back.
    tails: list[int] = []
    ends: list[int] = []  # index in candidates of the chain ending at tails[n]
    back = [-1] * len(candidates)
    for index, (_i, j) in enumerate(candidates):
        n = bisect_left(tails, j)
        back[index] = ends[n - 1] if n else -1
        if n == len(tails):
            tails.append(j)
            ends.append(index)
        else:
            tails[n], ends[n] = j, index
    chain = []
    index = ends[-1] if ends else -1
    while index >= 0:
        chain.append(candidates[index])
        index = back[index]
    return chain[::-1]
