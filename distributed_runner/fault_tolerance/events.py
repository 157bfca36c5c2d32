"""A change of the quorum, as data: what ``after_replica_change`` receives and the logs say."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaEvent:
    """``kind``: 'lost' (slots left the quorum) or 'joined' (slots came back, healed from a
    peer); ``slots``: which; ``iteration``: the step it happened in (0-based, the one in
    progress); ``seconds``: what it cost this replica (lost: from the start of the step that
    failed until the same global batch was committed without them; joined: the heal, on the
    replica that joined, else the quorum's wait); ``replicas``: the quorum's size after it."""

    kind: str
    slots: tuple[int, ...]
    iteration: int
    seconds: float
    replicas: int

    def describe(self) -> str:
        which = ", ".join(str(s) for s in self.slots)
        if self.kind == "lost":
            return (
                f"replica {which} lost at iteration {self.iteration + 1}: the step was trained "
                f"again by {self.replicas} replica(s), {self.seconds:.2f} s lost"
            )
        return (
            f"replica {which} joined at iteration {self.iteration + 1} "
            f"({self.replicas} replicas, {self.seconds:.2f} s)"
        )
