"""The fleet's input and parameter bytes (DESIGN §2.1): the same on every node by
construction, so a result on other bytes is a bug on that node, not a divergence."""

from __future__ import annotations

from collections.abc import Mapping

Inputs = tuple[str | None, str | None]  # (input_hash, param_hash)


def most_common_inputs(counts: Mapping[Inputs, int]) -> list[Inputs]:
    """The (input, param) hashes held by the most nodes; several when tied, in the order
    ``counts`` met them (the caller decides which of a tie is the fleet's)."""
    if not counts:
        return []
    most = max(counts.values())
    return [inputs for inputs, nodes in counts.items() if nodes == most]


def broken_inputs(own: Inputs, fleet: Inputs) -> list[str]:
    """The names of the hashes in which ``own`` differs from the fleet's; an unknown hash
    (None) differs from nothing."""
    return [name for name, mine, theirs in (("input_hash", own[0], fleet[0]),
                                             ("param_hash", own[1], fleet[1]))
            if mine is not None and theirs is not None and mine != theirs]
