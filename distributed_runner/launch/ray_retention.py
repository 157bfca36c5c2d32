"""Which of a run's checkpoints Ray Train keeps in its storage (``storage_path/<run>``): no more
than the run's folder keeps, the newest always.

Every checkpoint a worker saves is reported to Ray (:class:`hooks.ray_report_hook.RayReportHook`)
and Ray copies it into its storage; without a ``ray.train.CheckpointConfig`` it keeps them all (9
for the README's Ray run, whose folder keeps 3). The folder's retention is the CheckpointHook's
(``default_hooks.checkpoint``): the newest ``max_keep_ckpts`` periodic checkpoints (``-1`` or
``0``: all), ``last.pth``, and the ``save_topk`` best of each ``save_best`` key.

How Ray 2.60 keeps checkpoints (``ray.train.v2._internal.execution.checkpoint.
checkpoint_manager``): one list, ordered by report when ``checkpoint_score_attribute`` is None and
by that metric of each report otherwise (ties: the later report ranks higher); at each report all
but the top ``num_to_keep`` are deleted, except the latest report (a restarted group resumes from
it, ``ray.train.get_checkpoint``) and checkpoints still waiting for their asynchronous validation.
A score is fixed when its report arrives. So Ray keeps the top N of one ranking plus the newest;
it cannot keep two queues (the newest periodic ones *and* the best ones) the way the folder does.
:func:`ray_checkpoint_config` therefore asks for:

* no ``save_best``: the newest ``max_keep_ckpts`` reports (all when the folder keeps all).
  Those are periodic (or requested) checkpoints and ``last.pth``, which the folder keeps too.
* ``save_best``: the best ones and the newest. Every report carries :data:`RETENTION_SCORE`
  (:func:`retention_score`): a best checkpoint of the first ``save_best`` key its value, oriented
  so that higher is better (the CheckpointHook's rule, given or inferred), every other checkpoint
  :data:`NOT_A_BEST`, below any best; ``num_to_keep`` is ``save_topk``, at most
  ``max_keep_ckpts``. Ray then holds the folder's best file(s) of that key and the newest
  checkpoint, each also in the folder: never more folders than the run's folder has checkpoints.
  (Before the first best, the top ``num_to_keep`` are the newest others, which the folder keeps
  too, as ``num_to_keep`` is at most ``max_keep_ckpts``. Between bests of equal value the folder
  keeps the earlier file, Ray the later one: the same count, the same best value.)

Ray's storage holds fewer periodic checkpoints than the folder then: the newest report alone,
which is the best file when a best was saved after the periodic one of the same epoch (the same
state; that periodic file is in the folder only). A restarted group resumes from the newest
report, as before.

One exception: with ``val_cfg.mode='async'`` Ray keeps every checkpoint, as before. Rank 0 reads
each validation's result back from Ray's record of the validated checkpoint
(:class:`~distributed_runner.validation.backends.RayTrainBackend`, ``val_cfg.lag`` validations
later), and Ray drops the record with the checkpoint: a validated checkpoint outside the top
``num_to_keep`` would be gone before its result is read, and training would wait for it forever.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from distributed_runner.engine.hook_builder import merge_default_hooks
from distributed_runner.validation.async_validation import ValMode

RETENTION_SCORE = "retention_score"
"""The metric of every report Ray ranks checkpoints by when the run keeps best checkpoints."""

NOT_A_BEST = -sys.float_info.max
"""The retention score of a checkpoint that is not a best of the first ``save_best`` key: below
every best's (a finite number: Ray writes the scores into a JSON snapshot)."""

# CheckpointHook's defaults (hooks/checkpoint_hook.py; tests/unit/test_ray_retention.py compares)
DEFAULTS = {"max_keep_ckpts": -1, "save_best": None, "save_topk": 1}


def checkpoint_hook_args(cfg: Mapping) -> dict[str, Any] | None:
    """``max_keep_ckpts``, ``save_best`` and ``save_topk`` of the config's checkpoint hook
    (``default_hooks.checkpoint``, merged with the built-in default as the Runner merges it; a
    built Hook's attributes), or None when the config removes it."""
    spec = merge_default_hooks(cfg.get("default_hooks")).get("checkpoint")
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        return {key: spec.get(key, default) for key, default in DEFAULTS.items()}
    return {key: getattr(spec, key, default) for key, default in DEFAULTS.items()}


def _count(value: Any, default: int | None) -> int | None:
    """A positive int count, else ``default`` (a value the hook will refuse on the workers)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value if value > 0 else None


def retention(cfg: Mapping, val_mode: ValMode | None = None) -> tuple[int | None, bool]:
    """(``num_to_keep``, whether reports are ranked by :data:`RETENTION_SCORE`) for ``cfg``,
    whose ``val_cfg`` parsed is ``val_mode`` (the config's settings; None: inline);
    ``num_to_keep`` None keeps every checkpoint. See the module docstring."""
    args = checkpoint_hook_args(cfg)
    if args is None:  # no checkpoint hook: nothing removes a file from the run's folder
        return None, False
    if val_mode is not None and val_mode.is_async:  # results are read from Ray's records
        return None, False
    keep = _count(args["max_keep_ckpts"], None)  # -1 and 0 keep all (async_validation.retire)
    best = args["save_best"]
    if not best:
        return keep, False
    topk = _count(args["save_topk"], 1) or 1
    return (topk if keep is None else min(topk, keep)), True


def ray_checkpoint_config(cfg: Mapping, val_mode: ValMode | None = None) -> Any:
    """The ``ray.train.CheckpointConfig`` of a run of ``cfg`` (the Ray launcher's
    ``RunConfig``; ``val_mode``: its val_cfg, parsed): Ray's storage keeps no more checkpoints
    than the run's folder, the newest always (module docstring)."""
    import ray.train

    num_to_keep, ranked = retention(cfg, val_mode)
    if not ranked:
        return ray.train.CheckpointConfig(num_to_keep=num_to_keep)
    return ray.train.CheckpointConfig(
        num_to_keep=num_to_keep,
        checkpoint_score_attribute=RETENTION_SCORE,
        checkpoint_score_order="max",
    )


def retention_score(best: Mapping | None, key: str | None, rule: str | None) -> float:
    """A report's :data:`RETENTION_SCORE`: ``best`` is the saved checkpoint's ``meta['best']``
    (``{key: value}`` for a best checkpoint), ``key`` and ``rule`` the checkpoint hook's first
    ``save_best`` key and its rule (``'greater'``/``'less'``). Higher is better; a checkpoint that
    is no best of ``key`` (or a value that is no number) is :data:`NOT_A_BEST`."""
    if not best or key is None or key not in best or rule not in ("greater", "less"):
        return NOT_A_BEST
    try:
        value = float(best[key])
    except (TypeError, ValueError):
        return NOT_A_BEST
    if math.isnan(value):
        return NOT_A_BEST
    score = value if rule == "greater" else -value
    # finite, and never as low as NOT_A_BEST: a best always ranks above the others
    return min(max(score, -sys.float_info.max / 2), sys.float_info.max)
