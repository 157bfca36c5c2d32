"""Tiny registered components for in-process tests: a dataset of random vectors and an MLP with
BatchNorm and Dropout (so resume must restore running stats and RNG to be exact)."""
from __future__ import annotations

import contextlib
import faulthandler
import os
import random
import socket
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.gpu_models import GPT, SyntheticTokens
from benchmarks.ranks import leave_rank_process
from distributed_runner.core.registry import DATASETS, MODELS
from distributed_runner.tracking.sinks import LogSink
from hooks import HOOKS, MOUNT_POINTS, Hook


@DATASETS.register_module(force=True)
class ToyDataset(Dataset):
    """``n`` samples of 4 features; the label is whether their sum is positive."""

    def __init__(
        self, n: int = 40, seed: int = 0, with_index: bool = False, record: str | None = None
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x.sum(1) > 0).long()
        self.with_index = with_index
        self.fetched = 0  # __getitem__ calls: a resumed epoch must not fetch consumed samples
        self.record = record  # a file each fetch appends "pid index" to (any process, any rank)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        self.fetched += 1
        if self.record is not None:
            with open(self.record, "a") as f:
                f.write(f"{os.getpid()} {i}\n")
        item = {"inputs": self.x[i], "labels": self.y[i]}
        if self.with_index:
            item["index"] = torch.tensor(i)
        return item


@MODELS.register_module(force=True)
class ToyModel(nn.Module):
    def __init__(self, hidden: int = 8, dropout: float = 0.2) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, 2)
        self.seen: list[int] = []  # dataset indices of the training samples, in order

    def forward(self, inputs, labels=None, index=None, mode="predict"):
        if index is not None and self.training:
            self.seen.extend(index.tolist())
        logits = self.fc2(self.drop(F.relu(self.bn(self.fc1(inputs)))))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels), "acc": (logits.argmax(1) == labels)
                    .float().mean()}
        return logits


@MODELS.register_module(force=True)
class NeedsRealTensors(nn.Module):
    """A model whose constructor reads a value off its own weights: it cannot be built on the
    meta device, so the Ray driver leaves its checks to the workers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.scale = float(self.fc.weight.abs().max())


@MODELS.register_module(force=True)
class TinyBlocks(nn.Module):
    """Two residual MLP blocks between an input and an output layer: ``Block`` is the unit
    FSDP shards one by one."""

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

        def forward(self, x):
            return x + self.down(F.gelu(self.up(self.norm(x))))

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(4, width)
        self.blocks = nn.Sequential(self.Block(width), self.Block(width))
        self.head = nn.Linear(width, 2)

    def forward(self, inputs, labels=None, mode="predict"):
        logits = self.head(self.blocks(self.inp(inputs)))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        return logits


@MODELS.register_module(force=True)
class ToyGPT(GPT):
    """A transformer-shaped toy: the GPT-2 architecture of benchmarks/gpu_models.py (pre-norm
    causal-attention ``Block``s, tied embeddings) at vocabulary 64, context 16, width 32, 2
    layers, 2 heads: ``shard_modules=['Block']`` shards it as FSDP shards a real one."""

    def __init__(self, vocab: int = 64, context: int = 16, width: int = 32, layers: int = 2,
                 heads: int = 2) -> None:
        super().__init__(vocab, context, width, layers, heads)


@DATASETS.register_module(force=True)
class ToyTokens(SyntheticTokens):
    """``n`` random token sequences of ``context + 1`` tokens for :class:`ToyGPT`."""

    def __init__(self, n: int = 40, context: int = 16, vocab: int = 64) -> None:
        super().__init__(n, context, vocab, torch.device("cpu"))


class RecorderHook(Hook):
    """Overrides all 22 mount points and records the calls (name, and epoch/iter at call time)."""

    def __init__(self) -> None:
        self.calls: list[str] = []


def _recorder(name: str):
    def method(self, runner, *args, **kwargs):
        self.calls.append(name)
    method.__name__ = name
    return method


for _name in MOUNT_POINTS:
    setattr(RecorderHook, _name, _recorder(_name))


def base_cfg(work_dir: Path | str, **overrides: Any) -> dict:
    """A complete small config: 40 samples, batch 4 (10 iters/epoch), 3 epochs, validation.
    ``run_name='.'``: each test's folder is its run's (the layout of run folders under work_dir
    is tested by tests/unit/test_run_folders.py and the CLI tests, which leave it out)."""
    cfg = dict(
        work_dir=str(work_dir),
        run_name=".",
        model=dict(type="ToyModel"),
        train_dataloader=dict(dataset=dict(type="ToyDataset", n=40), batch_size=4,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        val_dataloader=dict(dataset=dict(type="ToyDataset", n=20, seed=1), batch_size=8,
                            sampler=dict(type="DefaultSampler", shuffle=False)),
        val_evaluator=dict(type="Accuracy"),
        val_cfg=dict(),
        train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                           checkpoint=dict(type="CheckpointHook", interval=1)),
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    for k, v in overrides.items():
        cfg[k] = v
    return cfg


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for a process group or a server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ports for services a test starts with fixed numbers: below the kernel's ephemeral range
# (32768-60999), where any process's port 0 lands, and above Ray's worker ports (10002-19999)
QUIET_PORTS = range(20000, 32768)


def free_ports(count: int, quiet: bool = False) -> list[int]:
    """``count`` distinct free ports: each socket is held until all are chosen (separate
    :func:`free_port` calls may return one port twice, as a CI run found: Ray refused a head
    whose dashboard and agent were given the same port). ``quiet``: from :data:`QUIET_PORTS`,
    which no other process is handed between this choice and the service binding it (a CI
    run's head got its runtime-env agent port taken by another Ray's agent, whose token auth
    then refused the head's jobs with 401)."""
    with contextlib.ExitStack() as stack:
        sockets = []
        candidates = random.sample(QUIET_PORTS, len(QUIET_PORTS)) if quiet else [0] * count
        for port in candidates:
            s = stack.enter_context(socket.socket())
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken
            sockets.append(s)
            if len(sockets) == count:
                break
        return [s.getsockname()[1] for s in sockets]


@contextlib.contextmanager
def gloo_rank(rank: int, port: int, world_size: int = 2, hang_s: float = 240) -> Iterator[None]:
    """Inside ``mp.spawn``'s worker: this process as ``rank`` of a local gloo group, one thread
    (as a 1-CPU Ray worker). A rank that fails exits at once (mp.spawn then ends the others,
    which would wait forever in a collective); a hang ends after ``hang_s`` with every thread's
    stack printed."""
    faulthandler.dump_traceback_later(hang_s, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    try:
        yield
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    leave_rank_process()


def _train_as_rank(rank: int, port: int, cfgs: tuple, world: int = 2) -> None:
    with gloo_rank(rank, port, world_size=world):
        from distributed_runner import Runner

        for cfg in cfgs:
            if isinstance(cfg, tuple):  # ("test", cfg)
                Runner.from_cfg(cfg[1]).test()
            else:
                Runner.from_cfg(cfg).train()


def train_on_gloo(*cfgs: dict | tuple[str, dict], nprocs: int = 2) -> None:
    """Each of ``cfgs`` (without a launcher), one after the other, trained (``("test", cfg)``:
    tested) by the same ``nprocs`` local gloo processes, one thread each as a 1-CPU Ray worker:
    an uninterrupted Ray run of a config ends with the same weights bit for bit, for a fraction
    of a Ray run's processes (the reference of a run that is interrupted on Ray). Several
    configs share one spawn: the processes' start and imports are most of a toy run's cost."""
    import torch.multiprocessing as mp

    mp.spawn(_train_as_rank, args=(free_port(), cfgs, nprocs), nprocs=nprocs, join=True)


def make_runner(work_dir: Path | str, **overrides: Any):
    from distributed_runner import Runner
    return Runner.from_cfg(base_cfg(work_dir, **overrides))


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_state_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


__all__ = [
    "HOOKS",
    "ListSink",
    "RecorderHook",
    "TinyBlocks",
    "ToyDataset",
    "ToyModel",
    "assert_state_equal",
    "base_cfg",
    "make_runner",
    "params_of",
]



class ListSink(LogSink):
    """Keeps LoggerHook's records in memory."""

    def __init__(self) -> None:
        self.records: list = []
        self.closed = False

    def write(self, record) -> None:
        self.records.append(record)

    def close(self) -> None:
        self.closed = True
