"""Which replica trains which slot's share of a global batch, given who is in the quorum.

A pure function, so that every replica in the quorum computes the same answer from the same
facts (the set of slots present) without a message.
"""

from __future__ import annotations


def shares_for(slot: int, present: set[int], replicas: int) -> list[int]:
    """The slots whose shares ``slot`` trains this step: its own first, then the missing slots
    dealt out in turn over the present ones in slot order (missing slot ``m``, the ``k``-th
    missing, goes to the ``k mod n``-th present slot).

    >>> shares_for(0, {0, 2}, 4), shares_for(2, {0, 2}, 4)
    ([0, 1], [2, 3])
    >>> shares_for(1, {1}, 3)
    [1, 0, 2]
    """
    order = sorted(present)
    if slot not in present:
        raise ValueError(f"slot {slot} is not in the quorum {order}")
    missing = [s for s in range(replicas) if s not in present]
    mine = [m for k, m in enumerate(missing) if order[k % len(order)] == slot]
    return [slot, *mine]
