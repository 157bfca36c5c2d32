"""The step of a fault-tolerant run (``fault_tolerance``): one quorum, one committed update.

Every iteration, on every replica in the quorum (distributed_runner/fault_tolerance)::

    present = the quorum's slots                   # waits for lost replicas' heartbeats to age;
                                                   # none in quorum_timeout: the step is tried again
    for slot in shares_for(my slot, present):      # my share, then the missing slots' I take
        loss of that slot's share x (its samples / the global batch), backward
    gradients summed over the quorum               # = the global batch's mean gradient
    if every replica of the quorum finished:       # should_commit: a vote
        optimizer step; the quorum's change is an event (after_replica_change)
    else:                                          # a replica died in the step
        the update is dropped and the same global batch is trained again

So the update of a global batch does not depend on who trained which share: the run without a
failure, with one, and one process over the whole batch end with the same weights (to float
tolerance; bit for bit when the sums group the same way, as with 2 replicas).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.checkpoint.state import collect_rank_state, collect_training_state
from distributed_runner.checkpoint.types import CheckpointSubject, SaveOptions
from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.data.elastic import GlobalBatchSampler
from distributed_runner.data.global_batch import MicroBatches
from distributed_runner.data.loaders import DefaultSampler, epoch_order
from distributed_runner.engine.step import GuardedStep, with_grad_norm
from distributed_runner.fault_tolerance.events import ReplicaEvent
from distributed_runner.fault_tolerance.replica import NoQuorum
from distributed_runner.fault_tolerance.shares import shares_for
from distributed_runner.model.sharding import is_sharded, local_tensor

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


class SlotShares:
    """Any data-parallel rank's share of the current pass's ``i``-th global batch, read from
    the dataset as that rank's loader reads it: the epoch's order (DefaultSampler's, a function
    of the seed and the epoch) cut into global batches of ``batch_size x ways``, share ``d``
    taking every ``ways``-th sample of each from the ``d``-th (the epoch's last, smaller one
    too: data/elastic.py's exact epochs). ``ways``: the replicas times a group's data-parallel
    ranks; group ``s``'s rank ``r`` reads share ``s x ranks + r`` (core/dist.py)."""

    def __init__(self, loader: Any, ways: int) -> None:
        sampler = getattr(loader, "sampler", None)
        if not isinstance(sampler, (DefaultSampler, GlobalBatchSampler)):
            raise ConfigError(
                "train_dataloader.sampler", "fault_tolerance needs DefaultSampler (options.py)"
            )
        self.loader, self.sampler, self.ways = loader, sampler, ways
        self.global_batch = int(loader.batch_size) * ways
        self._epoch: int | None = None
        self._order: list[int] = []

    def indices(self, share: int, batch: int) -> list[int]:
        s = self.sampler
        if self._epoch != s.epoch:
            self._epoch = s.epoch
            self._order = epoch_order(len(s.dataset), s.shuffle, s.seed, s.epoch)
        start = batch * self.global_batch
        end = min(start + self.global_batch, len(self._order))
        return self._order[start + share : end : self.ways]

    def read(self, indices: list[int]) -> Any:
        inner = getattr(self.loader, "loader", self.loader)  # a GlobalBatchLoader's DataLoader
        dataset, collate = inner.dataset, inner.collate_fn
        return collate([dataset[i] for i in indices])


class ReplicaStep(GuardedStep):
    """The step of the module docstring (``runner.replicas``: the ReplicaGroup)."""

    def __init__(self, runner: RunnerAPI, *args: Any) -> None:
        super().__init__(runner, *args)
        if runner.step_guards:
            raise ConfigError(
                "custom_hooks",
                "step guards (NonFiniteLossHook ...) are not agreed over a replica quorum yet: "
                "remove them from a fault_tolerance run",
            )
        self.group = runner.replicas
        # a group's data-parallel ranks (1: a replica of one process; its FSDP ranks), and
        # this process's among them: its shares are s x ranks + it for the slots s it trains
        self.ranks = dist.get_world_size()
        self.shares = SlotShares(runner.train_dataloader, self.group.replicas * self.ranks)
        # the sharded parameters (FSDP swaps gathered ones in while it computes)
        self.params = [p for p in runner.wrapped_model.parameters() if p.requires_grad]
        self._known: set[int] | None = None  # the last committed quorum (None: not yet)
        if runner.train_state.epoch_offset:  # set by a resume, which comes before the step
            raise ConfigError(
                "fault_tolerance", "a resume with a new global batch cannot run fault-tolerant"
            )

    def __call__(self, data_batch: Any) -> dict:
        runner = self.runner
        state, began = runner.train_state, time.monotonic()
        # every share's samples in this global batch: the same for a step trained again
        sizes = [len(self.shares.indices(d, state.batch_in_epoch)) for d in range(self.shares.ways)]
        while True:
            try:
                committed = self.try_step(data_batch, sizes, began)
            except NoQuorum as error:
                committed = None
                runner.logger.warning("%s: trying again", error)
            if committed is not None:
                return committed
            runner.optim_wrapper.zero_grad()

    def try_step(self, data_batch: Any, sizes: list[int], began: float) -> dict | None:
        """One try at the global batch: the outputs when the quorum committed it, else None."""
        runner, group, state = self.runner, self.group, self.runner.train_state
        group.start_step()  # the lighthouse answers while this replica trains its share
        parts = {group.slot: self.train_share(group.slot, data_batch, sizes)}
        present = group.slots_present(state.iter)
        # the missing slots' shares this replica takes (none while it is not yet counted)
        extra = shares_for(group.slot, present, group.replicas)[1:] if present else []
        for slot in extra:
            parts[slot] = self.train_share(slot, None, sizes)
        self.sum_gradients()
        if not group.commit():
            runner.logger.warning(
                "iteration %d was not committed (a replica failed in it): training it again",
                state.iter + 1,
            )
            return None
        runner.optim_wrapper.step()
        runner.optim_wrapper.zero_grad()
        self.note_quorum(present, state.iter, time.monotonic() - began)
        return with_grad_norm(runner.optim_wrapper, _weighted(parts, sizes, self.ranks))

    def train_share(self, slot: int, own: Any, sizes: list[int]) -> dict:
        """Backward over this rank's share of ``slot``'s part of the global batch (``own``: its
        batch as its loader gave it), its loss weighted by its part of the batch; its logged
        values. FSDP averages a group's gradients over its ranks: the weight is that many
        times larger, so that the group's sum is the samples' mean."""
        share = slot * self.ranks + dist.get_rank()
        batch = self.runner.train_state.batch_in_epoch
        weight = sizes[share] / sum(sizes) * self.ranks
        if not sizes[share]:  # no sample in the epoch's last, smaller batch
            if self.ranks == 1:
                return {}
            # the group's other ranks reduce this backward's gradients: it takes part, adding 0
            own, weight = self.shares.read(self.shares.indices(0, batch)), 0.0
        elif own is None or type(own) is MicroBatches:  # another slot's, or the last batch's own
            own = self.shares.read(self.shares.indices(share, batch))
        model, optim_wrapper = self.runner.wrapped_model, self.runner.optim_wrapper
        loss, log_vars = self.forward(model, optim_wrapper.optim_context(model), own)
        optim_wrapper.backward(loss * weight)
        return log_vars if weight else {}

    def sum_gradients(self) -> None:
        """The gradients summed over the quorum, in one collective (this rank's slices: rank
        ``r`` of every group holds the same ones)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [local_tensor(p.grad) for p in self.params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.group.sum(flat)
        for grad, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            grad.copy_(part.view_as(grad))

    def note_quorum(self, present: set[int], iteration: int, seconds: float) -> None:
        """A quorum that differs from the last committed one is an event: logged, counted in
        the scalars, and given to the hooks (``after_replica_change``)."""
        if not present:  # a replica's first step after it healed: it is counted from the next
            return
        known = self._known if self._known is not None else self.group.joined_slots
        runner, self._known = self.runner, present
        runner.message_hub.update_scalar("train/replicas", float(len(present)))
        if known is None or known == present:
            return
        for kind, slots in (("lost", known - present), ("joined", present - known)):
            if slots:
                event = ReplicaEvent(kind, tuple(sorted(slots)), iteration, seconds, len(present))
                runner.replica_event(event)


def _weighted(parts: dict[int, dict], sizes: list[int], ranks: int) -> dict:
    """The values logged for this rank's shares (of the slots in ``parts``), each weighted by
    its samples."""
    mine = {slot: sizes[slot * ranks + dist.get_rank()] for slot in parts}
    total = sum(mine[slot] for slot, values in parts.items() if values) or 1
    out: dict[str, Any] = {}
    for slot, values in parts.items():
        for key, value in values.items():
            out[key] = out.get(key, 0) + value * (mine[slot] / total)
    return out


@contextmanager
def in_quorum(runner: Any) -> Iterator[None]:
    """Around a fault-tolerant run's training: this replica's Manager started, the quorum of
    its first step joined (a replica behind it heals from a peer: the peer's training state is
    restored as a resume restores a checkpoint's), and shut down at the end. Nothing without
    ``fault_tolerance``."""
    group = runner.replicas
    if group is None:
        yield
        return
    bn = [type(m).__name__ for m in runner.model.modules() if getattr(m, "track_running_stats", 0)]
    if bn:
        runner.logger.warning(
            "fault_tolerance: %s keeps running statistics per replica (not averaged over the "
            "quorum), so they differ between replicas and with a lost replica",
            bn[0],
        )
    group.start(
        peer_state(runner),
        lambda ckpt: runner.resume(f"replica peer (healing slot {group.slot})", ckpt),
    )
    try:
        event = group.join(runner.iter)
        if event is not None:
            runner.replica_event(event)
        yield
    finally:
        group.shutdown()


def peer_state(runner: Any) -> Callable[[], dict]:
    """What this rank sends the same rank of a healing replica group: the checkpoint's training
    state; for a sharded model, this rank's slices of it, without a collective (it is read on
    torchft's thread while this rank's own share trains)."""
    if not is_sharded(runner.model):
        return lambda: collect_training_state(CheckpointSubject.of(runner), SaveOptions())
    params = list(runner.model.named_parameters())  # the sharded ones: no step has run yet
    return lambda: collect_rank_state(CheckpointSubject.of(runner), params)
