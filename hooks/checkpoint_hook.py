"""CheckpointHook: periodic, best, last and published checkpoints (the seeds' parameters)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from distributed_runner.checkpoint.files import (
    checksum_path,
    point_at,
    remove_checkpoint,
    remove_stale_temporaries,
)
from distributed_runner.checkpoint.parts import PUBLISHABLE_KEYS
from distributed_runner.checkpoint.publish import publish_checkpoint
from distributed_runner.checkpoint.remote import RemoteCopies, check_storage_options, run_folder
from distributed_runner.checkpoint.sharded import TRAINABLE, remove_orphan_shards, shard_folders
from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.interval import Interval
from distributed_runner.core.redact import redact_url
from distributed_runner.core.registry import HOOKS
from distributed_runner.core.storage import is_remote
from distributed_runner.engine.extension_points import CheckpointSaver
from distributed_runner.engine.hook import DataBatch, Hook
from distributed_runner.evaluation.metric_rules import (
    GREATER_KEYS,
    LESS_KEYS,
    infer_rule,
    require_metric,
)
from distributed_runner.validation import async_validation as async_val

# -- the arguments, checked when the hook is built ----------------------------------------------
# A mistake here (a float interval, ``save_topk=0``, a misspelled published key, a rule the hook
# cannot infer) would otherwise show up late, as a missing or wrong checkpoint, so each is refused
# at construction in one line naming the argument.
CHECKPOINT_KEYS = PUBLISHABLE_KEYS


def as_list(value: str | Sequence[str] | None) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def check_numbers(
    interval: int | str,
    max_keep_ckpts: int,
    save_begin: int,
    save_topk: int,
    by_epoch: bool,
    async_save: bool,
) -> None:
    """Refuse, one line naming the argument, what would otherwise misbehave silently later (a
    float interval, save_topk=0, by_epoch='no')."""
    if isinstance(interval, bool) or (
        isinstance(interval, (int, float))
        and (interval != int(interval) or interval == 0 or interval < -1)
    ):
        raise ArgumentError(
            "interval",
            f"got {interval!r}; takes an int >= 1, -1 (no "
            f"periodic checkpoints) or a spec like '500it', "
            f"'2ep', '30min'",
        )
    for name, value, low in (
        ("max_keep_ckpts", max_keep_ckpts, -1),
        ("save_begin", save_begin, 0),
        ("save_topk", save_topk, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ArgumentError(name, f"got {value!r}; takes an int >= {low}")
    for name, flag in (("by_epoch", by_epoch), ("async_save", async_save)):
        if not isinstance(flag, bool):
            raise ArgumentError(name, f"got {flag!r}; takes True or False")


def checked_published_keys(keys: str | Sequence[str] | None) -> list:
    """``published_keys`` checked against the checkpoint's parts (a typo would publish a file
    without them); the weights must be among them."""
    keys = as_list(keys)
    for k in keys:
        if k not in CHECKPOINT_KEYS:
            raise ArgumentError(
                "published_keys",
                f"unknown checkpoint key {k!r}; choose from {', '.join(CHECKPOINT_KEYS)}",
            )
    if keys and "state_dict" not in keys:
        raise ArgumentError("published_keys", "must include 'state_dict' (the weights)")
    return keys


def best_rules(save_best: list[str], rules: list, infer: Callable[[str], str]) -> list[str | None]:
    """One rule per ``save_best`` key: given once for all, one each, or inferred from the
    key's name by ``infer`` ('auto' waits for the first metric's)."""
    if "auto" in save_best and len(save_best) > 1:
        raise ArgumentError("save_best", "'auto' cannot be combined with other keys")
    if len(rules) == 1 and len(save_best) > 1:
        rules = rules * len(save_best)
    if rules and len(rules) != len(save_best):
        raise ArgumentError("rule", f"give one rule or one per save_best key ({len(save_best)})")
    for r in rules:
        if r not in ("greater", "less"):
            raise ArgumentError("rule", f"unknown rule {r!r}: use 'greater' or 'less'")
    rules = rules or [None] * len(save_best)
    return [
        infer(key) if key != "auto" and r is None else r
        for key, r in zip(save_best, rules, strict=True)
    ]


if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class CheckpointHook(Hook, CheckpointSaver):
    """Save checkpoints; only rank 0 touches files, every rank takes part in assembling them.

    * ``interval`` / ``by_epoch`` / ``save_begin``: save after every ``interval`` epochs (or
      iterations) counted from ``save_begin`` — ``interval=2, save_begin=5`` over 10 epochs saves
      epochs 5, 7 and 9. ``interval=-1`` (the default, MMEngine's) saves no periodic
      checkpoints; 0 and other negatives are mistakes and refused. ``interval`` may also
      be ``'500it'``, ``'2ep'`` or a wall time, ``'30min'``/``'1h'`` (rank 0's clock, checked
      after every iteration; a checkpoint request every rank agrees on; saved as
      ``iter_{N}.pth``).
    * ``max_keep_ckpts``: keep only the newest N periodic checkpoints (best ones are kept apart).
    * ``save_last``: when training completes and its final state is not already in a periodic
      checkpoint, save it as ``last.pth`` (a file of its own, like Lightning's ``last.ckpt``, so
      the periodic schedule stays exactly as configured).
    * ``save_best``: ``'auto'`` (the first validation metric), a metric key, or a list of keys;
      ``rule`` ``'greater'``/``'less'`` (or a list), else inferred from ``greater_keys`` /
      ``less_keys`` by substring; the best is ``best_{key}_epoch_{N}.pth`` and replaces the
      previous best. ``save_topk=K`` keeps the K best checkpoints of each key instead of one.
    * ``published_keys``: after training, the last and best checkpoints are also written with only
      these keys as ``{name}-{sha256[:8]}.pth``: any part :mod:`distributed_runner.checkpoint.parts`
      declares, but ``sharded``.
    * ``out_dir``: as MMEngine, checkpoints go to ``out_dir/<basename(work_dir)>`` (default:
      ``work_dir`` itself). A URI (``s3://``, ``gs://``, ``hdfs://``) gets a copy of each
      committed checkpoint, uploaded in the background, while the files stay in ``work_dir``
      (:mod:`distributed_runner.checkpoint.remote`); ``backend_args`` are its filesystem's options.
      MMEngine's deprecated ``file_client_args`` (a local ``backend``) and MMCV's
      ``create_symlink`` are accepted with a warning.
    * ``filename_tmpl`` (default ``epoch_{}.pth`` / ``iter_{}.pth``), ``save_optimizer``,
      ``save_param_scheduler``.
    * ``save_frozen_weights=False``: leave out the weights that do not train (a frozen base
      under LoRA), when ``load_from`` names the model directory that gives them back; resume
      takes them from there (checked before training starts). Default: every weight.
    * ``async_save``: write in the background; training waits only while the tensors are
      copied to host memory. The checkpoint commits (``last_checkpoint`` moves, old files go,
      Ray hears of it) once every rank's write is done — checked after every iteration — and a
      new save waits for the previous one (:mod:`distributed_runner.checkpoint.writer`).

    ``work_dir/last_checkpoint`` (and ``out_dir/last_checkpoint``) names the newest periodic or
    last checkpoint; ``resume=True`` starts from it. ``runner.request_checkpoint(reason)`` and
    preemption save through :meth:`save_on_request` (``iter_{N}.pth``, kept like periodic ones).
    """

    priority = "VERY_LOW"

    def __init__(
        self,
        interval: int | str = -1,
        by_epoch: bool = True,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        out_dir: str | None = None,
        max_keep_ckpts: int = -1,
        save_last: bool = True,
        save_best: str | Sequence[str] | None = None,
        rule: str | Sequence[str] | None = None,
        greater_keys: Sequence[str] | None = None,
        less_keys: Sequence[str] | None = None,
        filename_tmpl: str | None = None,
        published_keys: str | Sequence[str] | None = None,
        save_begin: int = 0,
        save_topk: int = 1,
        async_save: bool = False,
        backend_args: dict | None = None,
        file_client_args: dict | None = None,
        create_symlink: bool | None = None,
        save_frozen_weights: bool = True,
    ) -> None:
        check_numbers(interval, max_keep_ckpts, save_begin, save_topk, by_epoch, async_save)
        if not isinstance(save_frozen_weights, bool):
            raise ArgumentError(
                "save_frozen_weights", f"got {save_frozen_weights!r}; takes True or False"
            )
        self.save_frozen_weights = save_frozen_weights
        self.async_save = async_save
        # what a save's commit does (rank 0), by file name: move the pointer, remove old files
        self._on_commit: dict[str, tuple[bool, list[str]]] = {}
        self.every = Interval.parse(interval, bool(by_epoch), "interval")
        self.interval = interval
        self.by_epoch = bool(by_epoch)
        self.save_topk = int(save_topk)
        self.save_optimizer = save_optimizer
        self.save_param_scheduler = save_param_scheduler
        self._set_storage(out_dir, backend_args, file_client_args, create_symlink)
        self.max_keep_ckpts = int(max_keep_ckpts)
        self.save_last = save_last
        self.save_begin = int(save_begin)
        by_epoch_names = self.every.kind == "epoch" or (self.every.never and self.by_epoch)
        self.filename_tmpl = filename_tmpl or ("epoch_{}.pth" if by_epoch_names else "iter_{}.pth")
        if "{}" not in self.filename_tmpl:
            raise ArgumentError("filename_tmpl", "needs a '{}' for the epoch/iteration number")
        self._set_best(save_best, rule, greater_keys, less_keys)
        self.published_keys = checked_published_keys(published_keys)
        self._reset_bookkeeping()
        self.published: list[str] = []

    def _set_storage(
        self,
        out_dir: str | None,
        backend_args: dict | None,
        file_client_args: dict | None,
        create_symlink: bool | None,
    ) -> None:
        """Where checkpoints go (``out_dir``, a remote copy's options); MMCV's and MMEngine's
        older arguments accepted with a warning."""
        self.out_dir_arg = out_dir
        check_storage_options("CheckpointHook", out_dir, backend_args, file_client_args)
        if create_symlink is not None:
            warnings.warn(
                "CheckpointHook: create_symlink (MMCV's) is ignored: "
                "work_dir/last_checkpoint names the newest checkpoint",
                UserWarning,
                stacklevel=3,
            )
        self.backend_args = backend_args
        self.remote: RemoteCopies | None = None

    def _set_best(
        self,
        save_best: str | Sequence[str] | None,
        rule: str | Sequence[str] | None,
        greater_keys: Sequence[str] | None,
        less_keys: Sequence[str] | None,
    ) -> None:
        """Which metrics pick best checkpoints, and whether larger is better for each."""
        self.greater_keys = list(greater_keys) if greater_keys is not None else GREATER_KEYS
        self.less_keys = list(less_keys) if less_keys is not None else LESS_KEYS
        self.save_best = as_list(save_best)
        self.rules = best_rules(self.save_best, as_list(rule), self._infer_rule)

    def _reset_bookkeeping(self) -> None:
        """The state that survives a resume (:meth:`state_dict`), empty."""
        self.best_scores: dict[str, float] = {}
        self.best_files: dict[str, str] = {}
        self.top: dict[str, list] = {}  # key -> [[score, file], ...], best first (save_topk)
        self.kept: list[str] = []
        self.last_file: str | None = None
        self.last_saved_iter = -1

    # -- setup ---------------------------------------------------------------------------------
    def _infer_rule(self, key: str) -> str:
        rule = infer_rule(key, self.greater_keys, self.less_keys)
        if rule is not None:
            return rule
        raise ArgumentError(
            "rule",
            f"cannot tell whether a larger {key!r} is better: set rule='greater' or rule='less'",
        )

    def before_train(self, runner: RunnerAPI) -> None:
        if not self.save_frozen_weights and not runner.pretrained_from:
            raise ArgumentError(
                "save_frozen_weights",
                "False needs load_from=<a model directory> to give the frozen weights "
                "back on resume; set it, or save every weight",
            )
        names = runner.val_metric_names()  # checked now, not after the first epoch
        for key in self.save_best:
            if key != "auto":
                require_metric("save_best", key, names)
        work_dir = Path(runner.work_dir)
        if self.out_dir_arg and is_remote(self.out_dir_arg):  # copies go there, files stay here
            self.out_dir = work_dir
            if runner.rank == 0 and self.remote is None:
                self.remote = RemoteCopies(
                    run_folder(self.out_dir_arg, work_dir, runner.run_name),
                    self.backend_args,
                    runner.logger,
                )
        else:
            self.out_dir = (
                Path(run_folder(self.out_dir_arg, work_dir, runner.run_name)).expanduser().resolve()
                if self.out_dir_arg
                else work_dir
            )
        if runner.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            # a write that a crash or SIGKILL interrupted left a checkpoint-sized temporary
            count, size = remove_stale_temporaries(self.out_dir)
            count += remove_orphan_shards(self.out_dir)  # shards no manifest names
            if count:
                runner.logger.info(
                    "removed %d interrupted checkpoint write(s) from %s (%.1f MB)",
                    count,
                    self.out_dir,
                    size / 1e6,
                )
        if self.every.kind == "epoch" and not runner.by_epoch:
            runner.logger.warning(
                "CheckpointHook: by_epoch is True but training is "
                "iteration-based: set by_epoch=False to save every %s "
                "iterations",
                self.interval,
            )
        self.every.start_clock()

    # -- periodic ------------------------------------------------------------------------------
    def after_train_epoch(self, runner: RunnerAPI) -> None:
        if self.every.due_after_epoch(runner, self.save_begin):
            self._save_periodic(runner, self.filename_tmpl.format(runner.epoch + 1))

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        if self.async_save:
            runner.checkpoints.poll()  # commits a background save every rank has finished
        if self.every.kind == "time":  # rank 0's clock decides; the request makes ranks agree
            if runner.rank == 0 and self.every.time_due(agree=False):
                runner.request_checkpoint(f"{self.every.text} of wall time since the last save")
            return
        if self.every.due_after_iter(runner, self.save_begin):
            self._save_periodic(runner, self.filename_tmpl.format(runner.iter + 1))

    def save_on_request(self, runner: RunnerAPI, reason: str) -> Path:
        """Save now (a request or preemption, between iterations) as ``iter_{N}.pth``."""
        done = runner.train_state.position()["iter"]
        if self.last_saved_iter == done and self.last_file:
            return self.out_dir / self.last_file  # this very state was just saved
        name = f"iter_{done}.pth"
        self._save_periodic(runner, name)
        if runner.rank == 0:
            runner.logger.info("saved %s (%s)", name, reason)
        return self.out_dir / name

    def _save(
        self,
        runner: RunnerAPI,
        filename: str,
        meta: dict | None = None,
        point: bool = False,
        remove: Sequence[str] = (),
    ) -> Path:
        """Save ``filename``; when it commits, point ``last_checkpoint`` at it (``point``) and
        remove the files it replaces (``remove``): never before it is safely written."""
        self._on_commit[filename] = (point, list(remove))
        if not self.save_frozen_weights:  # the checkpoint records it (checkpoint/sharded.py)
            meta = {**(meta or {}), "weights": TRAINABLE}
        return runner.save_checkpoint(
            self.out_dir,
            filename,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            asynchronous=self.async_save,
        )

    def after_save_checkpoint(self, runner: RunnerAPI, path: Path, checkpoint: dict) -> None:
        point, remove = self._on_commit.pop(Path(path).name, (False, []))
        if runner.rank != 0:
            return
        if point:  # checkpoint.point_at: the one writer of last_checkpoint
            point_at(path, self.out_dir, runner.work_dir)
        if self.remote is not None:
            self.remote.upload(self._parts(Path(path)))
            self.remote.remove(
                [part.name for name in remove for part in self._parts(self.out_dir / name)]
            )
        for name in remove:
            remove_checkpoint(self.out_dir / name)

    @staticmethod
    def _parts(path: Path) -> list[Path]:
        """A checkpoint's files: itself, its checksum, its shard folders."""
        return [path, checksum_path(path), *shard_folders(path)]

    def _save_periodic(self, runner: RunnerAPI, filename: str) -> None:
        if filename not in self.kept:
            self.kept.append(filename)
        # a checkpoint still waiting for its asynchronous validation stays
        # (distributed_runner.validation.async_validation)
        removed = async_val.retire(self.kept, self.max_keep_ckpts, async_val.pinned(runner))
        self.last_file = filename
        self.last_saved_iter = runner.train_state.position()["iter"]
        self._save(runner, filename, point=True, remove=removed)

    # -- best ----------------------------------------------------------------------------------
    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        if not self.save_best or not metrics or runner.train_loop is None:
            return
        if self.save_best == ["auto"]:
            first = next(iter(metrics))
            self.save_best, self.rules = [first], [self.rules[0] or self._infer_rule(first)]
        for key, rule in zip(self.save_best, self.rules, strict=True):
            require_metric("save_best", key, metrics)
            value = float(metrics[key])
            top = self.top.setdefault(
                key,
                [[self.best_scores[key], self.best_files[key]]] if key in self.best_files else [],
            )
            better = (lambda a, b: a > b) if rule == "greater" else (lambda a, b: a < b)
            if len(top) >= self.save_topk and not better(value, top[-1][0]):
                continue
            unit, n = ("epoch", runner.epoch) if self.by_epoch else ("iter", runner.iter)
            validated = async_val.validated_position(runner)  # async: link the validated file
            n = validated[unit] if validated else n
            name = f"best_{re.sub(r'[^A-Za-z0-9_.-]+', '_', key)}_{unit}_{n}.pth"
            place = next((i for i, (score, _) in enumerate(top) if better(value, score)), len(top))
            top.insert(place, [value, name])
            dropped = [f for _, f in top[self.save_topk :] if f != name]
            del top[self.save_topk :]
            self.best_scores[key], self.best_files[key] = top[0]
            runner.message_hub.update_info(f"best_score/{key}", top[0][0])
            if validated:
                async_val.link_validated(runner, validated["path"], self.out_dir / name, dropped)
            else:
                self._save(runner, name, meta={"best": {key: value}}, remove=dropped)
            if runner.rank == 0:
                runner.logger.info(
                    "%s %s = %.4f: saved %s",
                    "new best" if place == 0 else f"top-{self.save_topk}",
                    key,
                    value,
                    name,
                )

    # -- end of training -----------------------------------------------------------------------
    def after_train(self, runner: RunnerAPI) -> None:
        loop = runner.train_loop
        finished = loop.stop_training or runner.iter >= runner.max_iters
        if not finished:  # training raised: its final state is nothing to keep
            self._wait_for_uploads(runner)
            return
        if self.save_last and self.last_saved_iter != runner.iter:
            self.last_file = "last.pth"
            self.last_saved_iter = runner.iter
            self._save(runner, "last.pth", point=True)
        runner.checkpoints.wait()  # an asynchronous save commits before anything reads it
        # files kept past max_keep_ckpts while their asynchronous validation was pending
        for name in async_val.retire(self.kept, self.max_keep_ckpts, set()):
            if runner.rank == 0:
                remove_checkpoint(self.out_dir / name)
        if self.published_keys and runner.rank == 0:
            names = ([self.last_file] if self.save_last and self.last_file else []) + list(
                self.best_files.values()
            )
            for name in dict.fromkeys(names):
                published = self.publish(self.out_dir / name)
                self.published.append(published.name)
                runner.logger.info("published %s", published)
                if self.remote is not None:
                    self.remote.upload([published, checksum_path(published)])
        self._wait_for_uploads(runner)

    def _wait_for_uploads(self, runner: RunnerAPI) -> None:
        if self.remote is not None:
            failed = self.remote.wait()
            if failed:
                runner.logger.error(
                    "%d of the copies to out_dir %s failed (the files are in %s): %s",
                    len(failed),
                    redact_url(self.remote.uri),
                    self.out_dir,
                    "; ".join(failed[:3]),
                )

    def publish(self, path: Path) -> Path:
        """Write ``path`` with only ``published_keys`` as ``{stem}-{sha256[:8]}.pth``."""
        return publish_checkpoint(path, self.published_keys)

    def saved_files(self) -> dict[str, list[Path]]:
        """The checkpoints a finished run keeps: ``last``, ``best`` and ``published`` (rank 0)."""

        def existing(names: list) -> list[Path]:
            return [self.out_dir / n for n in names if n and (self.out_dir / n).is_file()]

        best = [f for top in self.top.values() for _, f in top] or list(self.best_files.values())
        return {
            "last": existing([self.last_file] if self.save_last else []),
            "best": existing(best),
            "published": existing(self.published),
        }

    # -- resume --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "best_scores": dict(self.best_scores),
            "best_files": dict(self.best_files),
            "top": {k: [list(e) for e in v] for k, v in self.top.items()},
            "kept": list(self.kept),
            "last_file": self.last_file,
            "last_saved_iter": self.last_saved_iter,
            "save_best": list(self.save_best),
            "rules": list(self.rules),
        }

    def continue_bookkeeping(self, state: dict) -> None:
        """Take over the kept files and bests of a state this hook saved in another run (a PBT
        fork trains a donor trial's weights but keeps its own trial's files). Its newest save is
        not the state being trained now, so it counts as none: the next save is not skipped as
        a repeat and does not replace it as "last"."""
        self.load_state_dict({**state, "last_file": None, "last_saved_iter": -1})

    def load_state_dict(self, state: dict) -> None:
        self.best_scores = dict(state.get("best_scores", {}))
        self.best_files = dict(state.get("best_files", {}))
        self.top = {k: [list(e) for e in v] for k, v in state.get("top", {}).items()}
        self.kept = list(state.get("kept", []))
        self.last_file = state.get("last_file")
        self.last_saved_iter = int(state.get("last_saved_iter", -1))
        if self.save_best == ["auto"] and state.get("save_best") and state["save_best"] != ["auto"]:
            self.save_best, self.rules = list(state["save_best"]), list(state["rules"])
