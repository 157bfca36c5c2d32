"""The MessageHub derived instead of written: every runtime key and scalar a hook reads, at every
mount point, at every priority, is what it was when RuntimeInfoHook and IterTimerHook wrote every
value on every iteration (the design before issue 27, kept here as the reference: the ETA written
after every step, the throughput rates written when each step is counted, every per-iteration
scalar through ``update_scalar`` rather than the hub's writers) — also for a hook that holds a
history between iterations."""
from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

import hooks.iter_timer_hook as iter_timer_module
import tests.toy  # noqa: F401  (ToyDataset / ToyModel)
from distributed_runner import Runner
from distributed_runner.engine.message_hub import MessageHub
from distributed_runner.tracking.throughput import MFU, SAMPLES, TOKENS, per_second
from hooks import MOUNT_POINTS, Hook, IterTimerHook, RuntimeInfoHook
from tests.toy import base_cfg

PRIORITIES = ("HIGHEST", "VERY_HIGH", "ABOVE_NORMAL", "NORMAL", "BELOW_NORMAL", "LOWEST")


class WrittenIterTimerHook(IterTimerHook):
    """The reference design: the ETA written into the hub after every step, and the throughput
    rates at once."""

    def before_train(self, runner) -> None:
        super().before_train(runner)
        runner.message_hub.derive_info("eta", None)
        self._write_data_time = self._write_time = None  # update_scalar every time
        meter = self._meter
        if meter is not None:  # its rates written with update_scalar as each step is counted
            def start(hub) -> None:
                def at_once(key: str, scale: float):
                    return lambda figure: hub.update_scalar(key, *per_second(scale, figure))
                meter._write_samples = at_once(SAMPLES, meter._rate_scale)
                meter._write_tokens = at_once(TOKENS, meter._rate_scale) if meter._tokens else None
                meter._write_mfu = at_once(MFU, meter._mfu_scale) if meter._mfu_scale else None
            meter._start_recording = start

    def _record_eta(self, runner, now: float) -> None:
        it = runner.iter
        runner.message_hub.runtime_info["eta"] = (
            (now - self._train_start) / (it + 1 - self._start_iter) * (self._max_iters - it - 1))


class WrittenRuntimeInfoHook(RuntimeInfoHook):
    """The reference design: the learning rate and the step's outputs through update_scalar."""

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        hub = runner.message_hub
        hub.update_info("iter", runner.iter)
        for i, group in enumerate(runner.optim_wrapper.optimizer.param_groups):
            hub.update_scalar("train/lr" if i == 0 else f"train/lr_group{i}", group["lr"])

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        for key, value in (outputs or {}).items():
            runner.message_hub.update_scalar(f"train/{key}", value)


def _snapshot(hub: MessageHub, held: dict) -> dict:
    # first, before anything touches the hub: the histories this run's probes took once and
    # read from their own reference ever after
    kept = {k: (len(b), b.values()[-3:]) for k, b in sorted(held.items())}
    info = dict(hub.runtime_info)
    probes = {k: hub.get_info(k, "absent") for k in ("iter", "epoch", "max_iters", "max_epochs",
                                                       "eta")}
    scalars = {k: (len(b), b.current(), b.mean(), b.values()[-3:])
               for k, b in sorted(hub.log_scalars.items()) if len(b)}
    held.update({k: b for k, b in hub.log_scalars.items() if k not in held})
    return {"info": info, "get_info": probes, "contains_eta": "eta" in hub.runtime_info,
            "scalars": scalars, "held": kept}


def _probe_class(priority: str, seen: list, held: dict) -> type:
    """A hook at ``priority`` that snapshots the hub at every mount point it is called at."""
    def make(mount: str):
        def method(self, runner, *args, **kwargs) -> None:
            seen.append((mount, priority, _snapshot(runner.message_hub, held)))
        return method
    body = {m: make(m) for m in MOUNT_POINTS}
    body["priority"] = priority
    return type(f"Probe{priority}", (Hook,), body)


class EtaWriter(Hook):
    """A hook that writes ``eta`` itself after the 4th iteration of each epoch (before the timer
    at HIGH, after it at LOW)."""

    def __init__(self, priority: str) -> None:
        self.priority = priority

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter % 10 == 3:
            runner.message_hub.update_info("eta", 1234.5)


def _fake_clock(monkeypatch) -> None:
    """IterTimerHook's clock ticks 1 ms per read: both designs read it equally often."""
    ticks = iter(range(10**9))
    fake = lambda: next(ticks) * 1e-3  # noqa: E731
    monkeypatch.setattr(iter_timer_module, "perf_counter", fake)
    monkeypatch.setattr(iter_timer_module, "time", types.SimpleNamespace(perf_counter=fake))


def _run(tmp_path: Path, name: str, timer: Any, monkeypatch, writer_priority: str,
         resume_epochs: int = 0, runtime_info: Any = RuntimeInfoHook) -> list:
    seen: list = []
    held: dict = {}
    _fake_clock(monkeypatch)
    probes = [_probe_class(p, seen, held)() for p in PRIORITIES]
    cfg = base_cfg(tmp_path / name, custom_hooks=[*probes, EtaWriter(writer_priority)])
    cfg["train_cfg"] = dict(by_epoch=True, max_epochs=2, val_interval=1)
    cfg["default_hooks"] = dict(timer=timer(), logger=dict(type="LoggerHook", interval=3,
                                                           sinks=["jsonl"]),
                                checkpoint=dict(type="CheckpointHook", interval=1),
                                runtime_info=runtime_info())
    Runner.from_cfg(cfg).train()
    if resume_epochs:  # the hub comes back from the checkpoint: its stored eta included
        seen.clear()
        _fake_clock(monkeypatch)
        cfg["train_cfg"]["max_epochs"] = resume_epochs
        cfg["default_hooks"]["timer"] = timer()
        cfg["default_hooks"]["runtime_info"] = runtime_info()
        held.clear()
        cfg["custom_hooks"] = [*(_probe_class(p, seen, held)() for p in PRIORITIES),
                               EtaWriter(writer_priority)]
        cfg["resume"] = True
        Runner.from_cfg(cfg).train()
    return seen


@pytest.mark.parametrize("writer_priority", ["HIGH", "LOW"])
@pytest.mark.parametrize("resume_epochs", [0, 3])
def test_every_runtime_value_at_every_mount_point_is_the_written_designs(
        tmp_path, monkeypatch, writer_priority, resume_epochs):
    torch.manual_seed(0)
    derived = _run(tmp_path, "derived", IterTimerHook, monkeypatch, writer_priority,
                   resume_epochs)
    torch.manual_seed(0)
    written = _run(tmp_path, "written", WrittenIterTimerHook, monkeypatch, writer_priority,
                   resume_epochs, runtime_info=WrittenRuntimeInfoHook)
    assert len(derived) == len(written) > 100
    mounts = {m for m, _, _ in derived}
    assert {"before_train_iter", "after_train_iter", "after_val_epoch", "after_train",
            "before_save_checkpoint"} <= mounts
    for (m1, p1, s1), (m2, p2, s2) in zip(derived, written):
        assert (m1, p1) == (m2, p2)
        # the loss tensors' values and everything else must be the same; times come from the
        # fake clock, so they are equal too
        assert s1 == s2, f"{m1} at {p1}: {s1} != {s2}"
    etas = [s["get_info"]["eta"] for m, _, s in derived if m == "after_train_iter"]
    assert 1234.5 in etas and any(isinstance(e, float) and e != 1234.5 for e in etas)
    if resume_epochs:  # before the first step of the resumed run: the checkpoint's eta
        first = next(s for m, _, s in derived if m == "before_train")
        assert first["get_info"]["eta"] not in ("absent", None)


def test_a_derived_key_reads_its_provider_until_written_then_the_written_value_until_it_moves():
    hub = MessageHub()

    class Provider:
        def __init__(self) -> None:
            self.version: Any = None
            self.val: Any = None

        def value(self):
            from distributed_runner.engine.message_hub import MISSING
            return MISSING if self.val is None else self.val

        def stamp(self):
            return self.version

    provider = Provider()
    hub.update_info("eta", 7.0)  # stored before a provider exists (a loaded checkpoint)
    hub.derive_info("eta", provider)
    assert hub.get_info("eta") == 7.0 and "eta" in hub.runtime_info  # nothing to say yet
    provider.val, provider.version = 3.0, object()
    assert hub.get_info("eta") == 3.0 and hub.runtime_info["eta"] == 3.0
    hub.update_info("eta", 9.0)  # a hook writes it: that value until the provider moves on
    assert hub.get_info("eta") == 9.0
    provider.val, provider.version = 2.0, object()
    assert hub.get_info("eta") == 2.0
    assert hub.state_dict()["runtime_info"]["eta"] == 2.0
    with pytest.raises(ValueError, match="derived"):
        hub.runtime_info.store_for("eta")
    hub.derive_info("eta", None)
    assert hub.get_info("eta") == 9.0


def test_a_writers_values_are_in_its_history_for_every_reader_in_the_order_written():
    hub, reference = MessageHub(history=4), MessageHub(history=4)
    write = hub.scalar_writer("train/loss")
    assert "train/loss" not in hub.log_scalars  # nothing written yet: no history yet
    for v in (1.0, torch.tensor(2.0)):
        write(v)
        reference.update_scalar("train/loss", v)
    held = hub.get_scalar("train/loss")
    write(3.0)  # a history taken earlier sees it too, without going through the hub
    reference.update_scalar("train/loss", 3.0)
    assert len(held) == 3 and held.values() == [1.0, 2.0, 3.0]
    write(4.0)
    hub.update_scalar("train/loss", 5.0, count=2)  # after the writer's values, with its count
    reference.update_scalar("train/loss", 4.0)
    reference.update_scalar("train/loss", 5.0, count=2)
    write(6.0)
    reference.update_scalar("train/loss", 6.0)
    assert held.values() == reference.get_scalar("train/loss").values() == [3.0, 4.0, 5.0, 6.0]
    assert held.counts() == reference.get_scalar("train/loss").counts() == [1, 1, 2, 1]
    assert hub.state_dict() == reference.state_dict()

    state = hub.state_dict()
    write(7.0)  # before the load: belongs to the state the load replaces
    hub.load_state_dict(state)
    write(8.0)
    assert held.values()[-1] == 7.0  # the replaced history keeps what was its own
    assert hub.get_scalar("train/loss").values() == [4.0, 5.0, 6.0, 8.0]

    # a converting writer: figures turned into (value, count) when read
    rate = hub.scalar_writer("train/rate", lambda f: (f[0] / f[1], f[1]))
    rate((10, 2))
    rate((9, 3))
    assert hub.get_scalar("train/rate").values() == [5.0, 3.0]
    assert hub.get_scalar("train/rate").mean() == (10 + 9) / 5


def test_after_a_load_update_scalar_still_comes_after_the_writers_values():
    hub = MessageHub()
    write = hub.scalar_writer("train/time")
    write(1.0)
    state = hub.state_dict()
    hub.load_state_dict(state)  # a rollback: new histories, the same writers
    write(2.0)
    hub.get_scalar("train/time").update(3.0)  # a reader holding the new history writes too
    hub.update_scalar("train/time", 4.0)
    assert hub.get_scalar("train/time").values() == [1.0, 2.0, 3.0, 4.0]
