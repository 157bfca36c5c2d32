"""One replica group's side of the quorum: torchft's Manager, set up for exact steps.

Each replica is one process with its own TCPStore (torchft's Manager connects to one as a
client) and a Manager that talks to the lighthouse. Every step asks for its quorum when it
starts and the replica trains its own share while the lighthouse answers
(``use_async_quorum=True``); the missing slots' shares, known only from the answer, come after.
A replica joins before its loop starts (:meth:`ReplicaGroup.join`): it waits for that quorum and
applies the peer's state there, so its loop starts at the peer's position; in that first step it
is not yet counted (its gradients are zeroed by the sum) and the others train its share.
``init_sync=False``: every replica builds the same weights from the same seed.

The state a peer sends is the checkpoint's training state
(:func:`~distributed_runner.checkpoint.state.collect_training_state`, the parts table): weights,
optimizer, schedulers, counters, the data position, hooks' state, read while the sender trains
its own share of that step (nothing of it changes before the optimizer steps, but the random
streams: the joiner's are the sender's as they were then).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.fault_tolerance.events import ReplicaEvent
from distributed_runner.health.heartbeat import HEARTBEAT

SLOT_ENV = "DRUN_REPLICA"  # the launcher sets it: this process's replica slot
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name for the lighthouse's address
REPLACEMENT_ENV = "DRUN_REPLACEMENT"  # "1": this process replaces a lost replica: it must heal
HOST_ENV = "DRUN_REPLICA_HOST"  # the address peers reach this replica at (the Ray launcher's)
NO_PEER_EXIT = 76  # a replacement's exit status when no live replica was left to heal from
# (75 is the watchdog's hang verdict, health/watchdog.py: the launchers tell the two apart)


class NoQuorum(RuntimeError):
    """The lighthouse gave no quorum within ``quorum_timeout``: a peer that still heartbeats
    hangs (with 2 replicas one alone is no majority), or one is still joining. The step is
    tried again; the hung peer's watchdog ends it, and the quorum forms without it."""


class NoLivePeer(RuntimeError):
    """A replacement found no replica to heal from (the launcher then restarts them all)."""


def replica_slot(options: dict) -> int:
    """This process's slot, as the launcher set it; one line when it is not set."""
    raw = os.environ.get(SLOT_ENV)
    if raw is None or not raw.isdigit() or int(raw) >= options["replicas"]:
        raise ConfigError(
            "fault_tolerance",
            f"this process has no replica slot ({SLOT_ENV}={raw!r}): start the run with "
            f"drun train, which starts {options['replicas']} replicas",
        )
    return int(raw)


def join_rank_group() -> None:
    """In a process started as one rank of a replica group of several (``WORLD_SIZE`` > 1 and
    the group's rendezvous, ``MASTER_ADDR``/``MASTER_PORT``/``RANK``, in its environment, as
    the launchers set them): its torch process group, the group's own (FSDP shards over it)."""
    import torch.distributed as torch_dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch_dist.is_initialized():
        torch_dist.init_process_group()


def replica_group(options: dict | None, logger: logging.Logger) -> ReplicaGroup | None:
    """This process's replica group under ``fault_tolerance`` (None without it), its slot
    declared as the data-parallel rank of ``replicas`` (core/dist.py) before the data is built,
    so DefaultSampler reads the slot's share."""
    if options is None:
        dist.set_replica_layout(None)
        return None
    ranks = int(options["ranks_per_replica"])
    if dist.get_world_size() != ranks:
        raise ConfigError(
            "fault_tolerance.ranks_per_replica",
            f"this replica group has {dist.get_world_size()} process(es), not {ranks}: start "
            f"the run with drun train, which starts each group's processes",
        )
    slot = replica_slot(options)
    dist.set_replica_layout((slot, int(options["replicas"])))
    return ReplicaGroup(options, slot, logger)


class ReplicaGroup:
    """This replica's membership in the per-step quorum (``runner.replicas``)."""

    def __init__(self, options: dict, slot: int, logger: logging.Logger) -> None:
        self.options, self.slot, self.logger = options, slot, logger
        self.replicas = int(options["replicas"])
        self.manager: Any = None
        self._quorum_open = False  # join() took the quorum of the step to come
        # the slots of the quorum a healed replica joined, when it was whole (its first counted
        # step may already miss one: that is a loss to report, engine/replica_step.py)
        self.joined_slots: set[int] | None = None
        self._store: Any = None

    def start(
        self, state_dict: Callable[[], dict], load_state_dict: Callable[[dict], None]
    ) -> None:
        """Start this replica's Manager: ``state_dict`` is what a joining peer receives,
        ``load_state_dict`` what this replica does with a peer's when it joins."""
        from torchft import Manager, ProcessGroupGloo

        opts = self.options
        lighthouse = opts["lighthouse"] or os.environ.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            raise ConfigError(
                "fault_tolerance.lighthouse",
                f"no lighthouse address (set it, or {LIGHTHOUSE_ENV}; drun train starts one)",
            )
        # where the peers reach this replica's store, manager and heal transport: its node's
        # address on Ray (several machines), this machine's loopback for local processes
        host = os.environ.get(HOST_ENV) or "localhost"
        if host == "localhost":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        timeout = timedelta(seconds=opts["timeout"])
        store_port = self._group_store(host)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            min_replica_size=int(opts["min_replicas"]),
            use_async_quorum=True,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=opts["quorum_timeout"]),
            connect_timeout=timeout,
            rank=dist.get_rank(),  # in this replica group: rank r talks to the groups' rank r
            world_size=dist.get_world_size(),
            store_addr=host,
            store_port=store_port,
            lighthouse_addr=lighthouse,
            replica_id=f"drun_replica_{self.slot}",
            hostname=host,
            init_sync=False,
        )
        # a heal's transfer reads the peer's tensors from a read-only buffer, and torch warns
        # about that once in every replica that heals: it is torchft's choice, not the user's
        warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
        for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
            logging.getLogger(name).setLevel(logging.WARNING)  # a line a step otherwise
        # on a CPU, a warning at every new quorum that NCCL's flight recorder is not there
        logging.getLogger("torchft.manager").setLevel(logging.ERROR)

    def _group_store(self, host: str) -> int:
        """The port of this replica group's store (torchft's Manager connects to it as a
        client): its rank 0 serves it, the group's other ranks are told the port."""
        if dist.get_rank() == 0:
            from torch.distributed import TCPStore

            self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
        port = [self._store.port if self._store is not None else 0]
        if dist.is_distributed():
            import torch.distributed as torch_dist

            torch_dist.broadcast_object_list(port, src=0)
        return int(port[0])

    def join(self, done: int) -> ReplicaEvent | None:
        """Take part in the quorum of the next step, ``done`` steps into the run (0, or a
        checkpoint's ``iter``). A replica behind the quorum heals here: the peer's state is
        loaded (``load_state_dict``) before this returns. The event when it healed."""
        began, manager = time.monotonic(), self.manager
        manager.load_state_dict({"step": done, "batches_committed": 0})
        manager.start_quorum()
        manager.wait_quorum()
        self._quorum_open = True
        if manager._healing:  # as torchft 0.2's synchronous start_quorum does it
            manager._apply_pending_state_dict()
            manager._healing = False
        if manager.current_step() == done:
            if os.environ.get(REPLACEMENT_ENV) == "1":
                raise NoLivePeer(
                    f"replica {self.slot} was started to replace a lost one but formed a quorum "
                    f"alone at step {done}: no live replica was left to heal from"
                )
            return None
        count = manager.num_participants() + 1  # itself: counted from the next step
        self.joined_slots = set(range(self.replicas)) if count == self.replicas else None
        return ReplicaEvent(
            "joined", (self.slot,), manager.current_step(), time.monotonic() - began, count
        )

    def start_step(self) -> None:
        """Ask for the quorum of the step that starts (unless :meth:`join` did); the answer is
        awaited by :meth:`slots_present`."""
        if not self._quorum_open:
            self.manager.start_quorum()
        self._quorum_open = False

    def slots_present(self, iteration: int) -> set[int]:
        """The slots in the quorum of the step at ``iteration`` (0-based) that train it (a
        replica that has just healed takes part from its next step: empty for it then)."""
        manager = self.manager
        try:
            with HEARTBEAT.peers():  # a hung peer is its own watchdog's: this one waits longer
                count = manager.num_participants()  # waits for the quorum
        except Exception as error:  # what torchft's call to the lighthouse raised
            manager._quorum_future = None  # torchft 0.2's next start_quorum raises it again else
            raise NoQuorum(
                f"no quorum for iteration {iteration + 1} within fault_tolerance.quorum_timeout "
                f"({self.options['quorum_timeout']:g} s): {type(error).__name__}: {error}"
            ) from error
        if manager.current_step() != iteration:
            raise RuntimeError(
                f"replica {self.slot} is at step {manager.current_step()} of the quorum "
                f"but at iteration {iteration} of its loop"
            )
        if count == self.replicas:
            return set(range(self.replicas))
        flags = torch.zeros(self.replicas)
        flags[self.slot] = 1.0
        self.sum(flags)  # a replica not taking part adds zeros
        present = {s for s, f in enumerate(flags.tolist()) if f > 0.5}
        return present | {self.slot} if manager.is_participating() else set()

    def sum(self, tensor: torch.Tensor) -> None:
        """``tensor`` summed over the quorum, in place (a failure is recorded by the Manager
        and makes the step uncommitted; the tensor is then not to be used)."""
        from torch.distributed import ReduceOp

        with HEARTBEAT.peers():
            self.manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()

    def commit(self) -> bool:
        """Whether every replica of the quorum finished the step (then the update is applied
        everywhere); a failed collective anywhere says no for all."""
        with HEARTBEAT.peers():
            return bool(self.manager.should_commit())

    def shutdown(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
