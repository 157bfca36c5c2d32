"""Asynchronous validation (``val_cfg=dict(mode='async')``): the training loop's side.

At each point where the loop would validate (every ``val_interval``, the last, a
``request_val``), every rank instead:

1. makes sure a committed checkpoint holds this position — the periodic one saved just before
   when there is one, else ``iter_{N}.pth`` through ``runner.save_requested_checkpoint``;
2. notes it as validation ``k`` (k counts due validations); rank 0 hands it to a backend
   (:mod:`distributed_runner.validation.backends`: a background process, or Ray Train's
   validation tasks), which builds a Runner from the same config with ``load_from=<the
   checkpoint>`` and runs its validation loop and hooks (EMA, TTA, the evaluator as in-loop);
3. applies validation ``k - lag``: rank 0 waits for its result if it has not arrived, sends it to
   every rank (``broadcast_object``), and every rank calls ``after_val_epoch(metrics)`` on its
   hooks while :func:`validated_position` says which checkpoint the metrics belong to —
   LoggerHook logs them at that checkpoint's step, CheckpointHook links that file as the best,
   EarlyStoppingHook counts them; a stop it requests is acted on right there.

Because results are applied at due points, never when they happen to arrive, every rank takes
the same decisions at the same iteration, and a resumed run takes them exactly as an uninterrupted
one: the list of validations not applied yet travels in every checkpoint (the MessageHub's
runtime info, :data:`STATE_KEY`) and is handed to the backend again after a resume. Those
checkpoints are pinned (:func:`pinned`): ``max_keep_ckpts`` never removes one while
its validation is pending. When training ends, the outstanding validations are waited for and
applied before ``after_train``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.checkpoint.files import checksum_path, remove_checkpoint
from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.health.heartbeat import HEARTBEAT, VAL

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


STATE_KEY = "async_val/state"  # a JSON string: plain runtime info is saved in checkpoints


POSITION_KEY = "async_val/position"  # while validated results are applied (not saved)


def validated_position(runner: RunnerAPI) -> dict | None:
    """While an asynchronous validation's results are applied (``after_val_epoch``): the
    validated checkpoint's ``{'iter', 'epoch', 'path', 'applied_iter'}``; ``None`` in-loop."""
    return runner.message_hub.get_info(POSITION_KEY)


def pinned(runner: RunnerAPI) -> set[str]:
    """File names of checkpoints whose validation is pending: not to be removed yet."""
    return {Path(e["path"]).name for e in _load_state(runner)["pending"]}


def retire(kept: list[str], keep: int, pinned: set[str]) -> list[str]:
    """Take the oldest names out of ``kept`` until at most ``keep`` remain (``keep`` <= 0: keep
    all), skipping pinned ones, which stay until their validation is applied, and the newest (the
    one being saved); returns those taken out."""
    removed: list[str] = []
    while keep > 0 and len(kept) > keep:
        name = next((n for n in kept[:-1] if n not in pinned), None)
        if name is None:
            break
        kept.remove(name)
        removed.append(name)
    return removed


def link_validated(runner: RunnerAPI, source: str, target: Path, remove: list[str]) -> None:
    """Rank 0: ``target`` becomes the validated checkpoint ``source`` (a hard link, else a copy;
    with its checksum) instead of a new save of the current state; ``remove`` (names beside it)
    go."""
    if runner.rank != 0:
        return
    for src, dst in ((Path(source), target), (checksum_path(Path(source)), checksum_path(target))):
        if not src.is_file():
            continue
        dst.unlink(missing_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    for name in remove:
        remove_checkpoint(target.parent / name)


def _load_state(runner: RunnerAPI) -> dict:
    text = runner.message_hub.get_info(STATE_KEY)
    return json.loads(text) if text else {"next": 0, "pending": [], "due_at": -1}


def _store_state(runner: RunnerAPI, state: dict) -> None:
    runner.message_hub.update_info(STATE_KEY, json.dumps(state, sort_keys=True))


class AsyncValidation:
    """One training run's asynchronous validations (see the module docstring)."""

    def __init__(self, runner: RunnerAPI, lag: int) -> None:
        from distributed_runner.validation.backends import make_backend

        self.runner, self.lag = runner, lag
        self.backend = make_backend(runner) if runner.rank == 0 else None

    # -- the loop's calls ----------------------------------------------------------------------
    def start(self) -> None:
        """After a resume: the validations the checkpoint had not applied are handed over again,
        and a due point whose checkpoint this is is taken up."""
        state, runner = _load_state(self.runner), self.runner
        if self.backend is not None:
            self.backend.begin()  # a background process starts with training
            for entry in state["pending"]:
                self.backend.submit(entry, resumed=True)
        if state["due_at"] >= 0 and state["due_at"] == runner.iter:
            self.at_due_point()  # the run stopped right after saving this due point's checkpoint

    def at_due_point(self) -> None:
        """Steps 1-3 of the module docstring, on every rank."""
        runner = self.runner
        state = _load_state(runner)
        state["due_at"] = runner.iter  # in the checkpoint saved next: resume takes this point up
        _store_state(runner, state)
        path = runner.save_requested_checkpoint("asynchronous validation")
        runner.checkpoints.wait()  # committed before another process reads it
        entry = {"k": state["next"], "iter": runner.iter, "epoch": runner.epoch, "path": str(path)}
        state["next"] += 1
        state["pending"].append(entry)
        state["due_at"] = -1
        _store_state(runner, state)
        if self.backend is not None:
            self.backend.submit(entry)
        self._apply(until=entry["k"] - self.lag)

    def finish(self) -> None:
        """The end of training: every outstanding validation waited for and applied."""
        self._apply(until=None)

    def close(self, wait: bool = True) -> None:
        if self.backend is not None:
            self.backend.close(wait)

    # -- applying results ----------------------------------------------------------------------
    def _apply(self, until: int | None) -> None:
        runner = self.runner
        while True:
            state = _load_state(runner)
            if not state["pending"] or (until is not None and state["pending"][0]["k"] > until):
                return
            entry = state["pending"][0]
            # waiting for a validation is the validation's time, not a hang (health/heartbeat.py)
            with HEARTBEAT.slow(VAL):
                result = self.backend.result(entry) if self.backend is not None else None
                result = dist.broadcast_object(result)
            state["pending"].pop(0)
            _store_state(runner, state)
            self._apply_one(entry, result or {})

    def _apply_one(self, entry: dict, result: dict) -> None:
        runner = self.runner
        name = Path(entry["path"]).name
        if "error" in result:
            if runner.rank == 0:
                runner.logger.warning(
                    "asynchronous validation of %s (iter %d) failed, its result is skipped: %s",
                    name,
                    entry["iter"],
                    result["error"],
                )
            return
        metrics = result.get("metrics", {})
        if runner.rank == 0:
            runner.logger.info(
                "asynchronous validation of %s (iter %d), applied at iter %d: %s",
                name,
                entry["iter"],
                runner.iter,
                "  ".join(f"{k}: {v:.4f}" for k, v in metrics.items()),
            )
        position = {**entry, "applied_iter": runner.iter, "seconds": result.get("seconds")}
        runner.message_hub.update_info(POSITION_KEY, position)
        try:
            runner.call_hook("after_val_epoch", metrics=metrics)
        finally:
            runner.message_hub.update_info(POSITION_KEY, None)


@contextmanager
def validation_mode(loop: Any) -> Iterator[AsyncValidation | None]:
    """Around a training loop's run: ``None`` for in-loop validation; else the run's
    :class:`AsyncValidation`, started (a resume's pending validations handed over) and, when
    training ends without an exception, finished; its backend closed either way."""
    runner = loop.runner
    mode = runner.val_mode
    if not mode.is_async or runner.val_loop is None:
        yield None
        return
    if not runner.cfg or "val_cfg" not in runner.cfg:
        raise ConfigError(
            "val_cfg.mode",
            "'async' builds the validation from the run's config: build the Runner with "
            "Runner.from_cfg(cfg)",
        )
    controller, finished = AsyncValidation(runner, mode.lag), False
    try:
        controller.start()
        yield controller
        controller.finish()
        finished = True
    finally:  # training raised (or was preempted): a validation in flight is not waited for
        controller.close(wait=finished)


def report_validation(runner: RunnerAPI, meta: dict) -> Any:
    """What RayReportHook passes as ``validation=`` for a checkpoint with ``meta``: a
    ``ValidationTaskConfig`` when it is a due point's checkpoint in async mode, else False."""
    if not runner.val_mode.is_async or runner.val_loop is None:
        return False
    due = bool(meta.get("val_pending")) or _load_state(runner)["due_at"] == meta.get("iter")
    if not due:
        return False
    from ray.train import ValidationTaskConfig

    return ValidationTaskConfig(fn_kwargs={"iter": meta.get("iter"), "epoch": meta.get("epoch")})


# ``val_cfg``'s own keys for where validation runs: ``mode``, ``lag`` and ``resources``.
#
# ``val_cfg=dict(mode='inline')`` (the default) validates inside the training loop, as MMEngine
# does. ``mode='async'`` validates each due checkpoint on separate resources while training goes on
# (:mod:`distributed_runner.validation.async_validation`); its results are applied ``lag`` due
# validations later on every rank (default 1), so decisions taken on them (early stopping, the best
# checkpoint) land at fixed iterations and a resumed run takes them exactly as an uninterrupted one.
# ``resources`` is what one validation takes on Ray (``{'CPU': 1, 'GPU': 0}`` by default; the
# launcher refuses a cluster that would leave it nothing). The other keys of ``val_cfg`` are the
# validation loop's arguments; these three are taken out before the loop is built.
MODES = ("inline", "async")


KEYS = ("mode", "lag", "resources")


RESOURCE_NAMES = ("CPU", "GPU")


@dataclass(frozen=True)
class ValMode:
    """Where validation runs; see the module docstring.

    Args:
        mode (str): 'inline' (the training loop validates) or 'async' (Ray tasks validate
            saved checkpoints while training goes on).
        lag (int): due validations that may be outstanding before training waits for them.
        resources (dict): what one asynchronous validation task takes, e.g. ``{'CPU': 1}``.
    """

    mode: str = "inline"
    lag: int = 1
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0, "GPU": 0.0})

    @property
    def is_async(self) -> bool:
        return self.mode == "async"


def parse_val_mode(val_cfg: Any) -> ValMode:
    """The :class:`ValMode` ``val_cfg`` asks for; one ConfigError line for a mistake."""
    if not isinstance(val_cfg, dict):
        return ValMode()
    mode = val_cfg.get("mode", "inline")
    if mode not in MODES:
        raise ConfigError(
            "val_cfg.mode",
            f"got {mode!r}; takes 'inline' or 'async'"
            + (did_you_mean(mode, MODES) if isinstance(mode, str) else ""),
        )
    lag = val_cfg.get("lag", 1)
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
        raise ConfigError("val_cfg.lag", f"got {lag!r}; takes an int >= 0 (due validations)")
    resources = val_cfg.get("resources", {"CPU": 1, "GPU": 0})
    if not isinstance(resources, dict):
        raise ConfigError("val_cfg.resources", f"got {resources!r}; takes a dict like {{'CPU': 1}}")
    for name, amount in resources.items():
        if name not in RESOURCE_NAMES:
            raise ConfigError(
                "val_cfg.resources",
                f"unknown resource {name!r}; takes 'CPU' and 'GPU'"
                + did_you_mean(str(name), RESOURCE_NAMES),
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ConfigError("val_cfg.resources", f"{name}: got {amount!r}; takes a number >= 0")
    if mode == "async" and not any(resources.values()):
        raise ConfigError("val_cfg.resources", "an async validation needs some CPU or GPU")
    full = {"CPU": 0.0, "GPU": 0.0, **{k: float(v) for k, v in resources.items()}}
    if "CPU" not in resources:
        full["CPU"] = 1.0
    return ValMode(mode=mode, lag=lag, resources=full)


def val_loop_args(val_cfg: dict | None) -> dict | None:
    """``val_cfg`` without this module's keys: the validation loop's own arguments."""
    if val_cfg is None:
        return None
    return {k: v for k, v in val_cfg.items() if k not in KEYS}


def check_val_resources(
    mode: ValMode, per_worker: dict[str, float], workers: int, total: dict[str, float]
) -> None:
    """One line when the cluster would leave an async validation (``mode``: val_cfg's, parsed)
    nothing to run on: Ray would not refuse it, the validation would just wait silently until
    training ends."""
    if not mode.is_async:
        return
    for resource, need in mode.resources.items():
        have = float(total.get(resource, 0))
        spare = have - float(per_worker.get(resource, 0)) * workers
        if need > 0 and spare < need:
            raise ConfigError(
                "val_cfg.resources",
                f"asynchronous validation needs {need:g} {resource} beside the {workers} "
                f"training workers, and the cluster has {have:g} {resource}, {max(spare, 0):g} "
                f"left: lower launcher.num_workers, lower val_cfg.resources or add nodes",
            )
