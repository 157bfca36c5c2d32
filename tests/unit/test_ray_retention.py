"""Ray's storage keeps no more checkpoints than the run's folder, the newest always
(:mod:`distributed_runner.launch.ray_retention`): the ``CheckpointConfig`` from the checkpoint
hook's config, the score each report carries, and sequences of saves run through Ray 2.60's own
checkpoint manager beside a model of the CheckpointHook's folder. No Ray workers."""
from __future__ import annotations

import asyncio
import inspect
import os
import random
import re

import pytest

from distributed_runner.launch.ray_retention import (
    DEFAULTS,
    NOT_A_BEST,
    RETENTION_SCORE,
    ray_checkpoint_config,
    retention,
    retention_score,
)


def hook(**args):
    return {"default_hooks": {"checkpoint": {"type": "CheckpointHook", "interval": 1, **args}}}


def test_the_defaults_are_the_checkpoint_hooks():
    from hooks.checkpoint_hook import CheckpointHook

    params = inspect.signature(CheckpointHook.__init__).parameters
    assert {k: params[k].default for k in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize("cfg, expected", [
    ({}, (None, False)),  # the built-in CheckpointHook keeps every checkpoint
    ({"default_hooks": {"checkpoint": None}}, (None, False)),  # no hook: nothing is removed
    ({"default_hooks": {"checkpoint": {"max_keep_ckpts": 3}}}, (3, False)),  # merged default
    (hook(max_keep_ckpts=2), (2, False)),
    (hook(max_keep_ckpts=-1), (None, False)),
    (hook(max_keep_ckpts=0), (None, False)),  # 0 keeps all, as the hook does
    (hook(max_keep_ckpts=2, save_best="accuracy"), (1, True)),  # the README's config
    (hook(max_keep_ckpts=2, save_best="auto"), (1, True)),
    (hook(max_keep_ckpts=2, save_best=["accuracy", "loss"], save_topk=3), (2, True)),
    (hook(save_best="accuracy", save_topk=3), (3, True)),  # every periodic one kept: topk
    (hook(max_keep_ckpts="2", save_best=None), (None, False)),  # refused on the workers
    # async validation: rank 0 reads each result from Ray's record of its checkpoint
    ({**hook(max_keep_ckpts=1, save_best="acc"), "val_cfg": {"mode": "async"}}, (None, False)),
    ({**hook(max_keep_ckpts=1), "val_cfg": {"mode": "inline"}}, (1, False)),
])
def test_what_ray_keeps_follows_the_checkpoint_hook(cfg, expected):
    from distributed_runner.validation.async_validation import parse_val_mode

    assert retention(cfg, parse_val_mode(cfg.get("val_cfg"))) == expected


def test_a_built_hook_in_default_hooks_is_read_too():
    from hooks.checkpoint_hook import CheckpointHook

    built = CheckpointHook(interval=1, max_keep_ckpts=4, save_best="acc", rule="greater",
                           save_topk=2)
    assert retention({"default_hooks": {"checkpoint": built}}) == (2, True)


def test_the_ray_checkpoint_config():
    plain = ray_checkpoint_config(hook(max_keep_ckpts=2))
    assert (plain.num_to_keep, plain.checkpoint_score_attribute) == (2, None)
    ranked = ray_checkpoint_config(hook(max_keep_ckpts=2, save_best="accuracy"))
    assert (ranked.num_to_keep, ranked.checkpoint_score_attribute,
            ranked.checkpoint_score_order) == (1, RETENTION_SCORE, "max")
    assert ray_checkpoint_config({}).num_to_keep is None


def test_the_retention_score():
    assert retention_score({"acc": 0.9}, "acc", "greater") == 0.9
    assert retention_score({"loss": 0.25}, "loss", "less") == -0.25
    assert retention_score({"loss": 0.25}, "acc", "greater") == NOT_A_BEST  # another key's best
    assert retention_score(None, "acc", "greater") == NOT_A_BEST  # a periodic checkpoint
    assert retention_score({"acc": float("nan")}, "acc", "greater") == NOT_A_BEST
    assert retention_score({"acc": 1.0}, None, None) == NOT_A_BEST  # save_best='auto', unresolved
    assert NOT_A_BEST < retention_score({"loss": float("inf")}, "loss", "less") < -1e300
    assert retention_score({"acc": float("inf")}, "acc", "greater") < float("inf")


# -- sequences of saves: Ray's own manager beside the folder -------------------------------------
class Folder:
    """What CheckpointHook keeps (hooks/checkpoint_hook.py, synchronous saves): the newest
    ``keep`` periodic files (<= 0: all), ``last.pth``, the ``topk`` best of each key (a value
    enters only when strictly better than the worst kept, once the top is full)."""

    def __init__(self, keep: int, topk: int, rules: dict[str, str]) -> None:
        self.keep, self.topk, self.rules = keep, topk, rules
        self.kept: list[str] = []
        self.top: dict[str, list] = {key: [] for key in rules}
        self.files: set[str] = set()

    def periodic(self, name: str) -> None:
        self.kept.append(name)
        self.files.add(name)
        while self.keep > 0 and len(self.kept) > self.keep:
            self.files.discard(self.kept.pop(0))

    def val(self, key: str, value: float, name: str) -> bool:
        better = (lambda a, b: a > b) if self.rules[key] == "greater" else (lambda a, b: a < b)
        top = self.top[key]
        if len(top) >= self.topk and not better(value, top[-1][0]):
            return False
        place = next((i for i, (score, _) in enumerate(top) if better(value, score)), len(top))
        top.insert(place, (value, name))
        for _, dropped in top[self.topk:]:
            self.files.discard(dropped)
        del top[self.topk:]
        self.files.add(name)
        return True


def run_through_ray(tmp_path, cfg, events, ties=False):
    """Each event saved by the Folder model and reported to Ray 2.60's CheckpointManager with the
    config's CheckpointConfig; after every report: never more folders in Ray's storage than files
    in the run's folder, the newest among them, the folder's best among them; and without ties,
    every one of Ray's is in the run's folder. (Between equal values the folder keeps the earlier
    file and Ray the later one: the same count, the same best value.)"""
    import ray.train
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import (
        CheckpointManager,
    )
    from ray.train.v2._internal.execution.storage import StorageContext
    from ray.train.v2._internal.execution.training_report import _TrainingReport

    args = cfg["default_hooks"]["checkpoint"]
    keys = [args["save_best"]] if isinstance(args.get("save_best"), str) else list(
        args.get("save_best") or [])
    rules = dict(zip(keys, args.get("rule") or ["greater"] * len(keys), strict=True))
    folder = Folder(args.get("max_keep_ckpts", -1), args.get("save_topk", 1), rules)
    storage = StorageContext(str(tmp_path), "run")

    def stored():
        return {re.sub(r"-\d+$", "", p) for p in os.listdir(tmp_path / "run")
                if (tmp_path / "run" / p).is_dir()}

    values: dict[str, float | None] = {}

    async def main():
        manager = CheckpointManager(ray_checkpoint_config(cfg), storage)
        for i, (kind, *what) in enumerate(events):
            if kind == "val":
                key, value = what
                name = f"best_{key}_iter_{i}.pth"
                if not folder.val(key, value, name):
                    continue
                meta = {"best": {key: value}}
            else:
                name = "last.pth" if kind == "last" else f"iter_{i}.pth"
                if kind == "periodic":
                    folder.periodic(name)
                else:
                    folder.files.add(name)
                meta = {}
            path = storage.build_checkpoint_path_from_name(f"{name}-{i}")
            os.makedirs(path)
            score = retention_score(meta.get("best"), keys[0] if keys else None,
                                    rules.get(keys[0]) if keys else None)
            manager.register_checkpoint(_TrainingReport(
                ray.train.Checkpoint(path), {"checkpoint": name, RETENTION_SCORE: score}, False))
            values[name] = meta.get("best", {}).get(keys[0]) if keys else None
            held = stored()
            assert name in held, (i, name)  # a restart gets the newest
            assert len(held) <= len(folder.files), (i, held, folder.files)
            assert ties or held <= folder.files, (i, held, folder.files)
            if keys and folder.top[keys[0]]:  # the best value of the first key is in Ray's
                best = folder.top[keys[0]][0][0]
                assert any(values.get(n) == best for n in held), (i, held, best)
        return stored(), folder.files

    return asyncio.run(main())


def test_the_readme_run_keeps_the_best_and_the_newest(tmp_path):
    """configs/digits_cnn.py: 12 epochs, a checkpoint every 4 (max_keep_ckpts=2), the best
    accuracy saved at each improvement: the folder keeps 3, Ray 2 (9 before)."""
    accuracy = [0.80, 0.90, 0.88, 0.93, 0.95, 0.94, 0.96, 0.96, 0.97, 0.97, 0.975, 0.97]
    events = []
    for epoch, value in enumerate(accuracy, 1):
        if epoch % 4 == 0:
            events.append(("periodic",))
        events.append(("val", "accuracy", value))
    cfg = hook(interval=4, max_keep_ckpts=2, save_best="accuracy")
    ray_kept, folder = run_through_ray(tmp_path, cfg, events)
    assert len(folder) == 3 and len(ray_kept) == 2
    assert {n for n in ray_kept if n.startswith("best_")} == {
        n for n in folder if n.startswith("best_")}


@pytest.mark.parametrize("seed, ties", [(seed, seed % 2 == 1) for seed in range(8)])
def test_random_runs_never_leave_ray_more_than_the_folder(tmp_path, seed, ties):
    rng = random.Random(seed)
    keep, topk = rng.choice([-1, 1, 2, 3]), rng.choice([1, 2, 3])
    keys = rng.choice([[], ["acc"], ["acc", "loss"]])
    args = dict(max_keep_ckpts=keep, save_topk=topk)
    if keys:
        args.update(save_best=keys, rule=["greater", "less"][:len(keys)])
    events = []
    for _ in range(40):
        if rng.random() < 0.4:
            events.append(("periodic",))
        for key in keys:
            value = rng.random()
            events.append(("val", key, round(value, 1) if ties else value))
    events.append(("last",))
    ray_kept, folder = run_through_ray(tmp_path, hook(**args), events, ties)
    assert 1 <= len(ray_kept) <= len(folder)


def test_the_report_hook_scores_by_the_checkpoint_hooks_first_key_and_rule():
    from types import SimpleNamespace

    from hooks.checkpoint_hook import CheckpointHook
    from hooks.ray_report_hook import RayReportHook

    def score(saver, meta):
        return RayReportHook._retention_score(SimpleNamespace(get_hook=lambda name: saver), meta)

    saver = CheckpointHook(interval=1, save_best=["loss", "acc"], rule=["less", "greater"])
    assert score(saver, {"best": {"loss": 0.5}}) == -0.5  # less is better: negated
    assert score(saver, {"best": {"acc": 0.9}}) == NOT_A_BEST  # another key's best
    assert score(saver, {"iter": 3}) == NOT_A_BEST  # a periodic checkpoint
    auto = CheckpointHook(interval=1, save_best="auto")
    assert score(auto, {"best": {"auto": 1.0}}) == NOT_A_BEST  # before the first validation
    auto.save_best, auto.rules = ["accuracy"], ["greater"]  # as after_val_epoch resolves it
    assert score(auto, {"best": {"accuracy": 0.97}}) == 0.97
    assert score(None, {"best": {"acc": 1.0}}) == NOT_A_BEST  # no checkpoint hook
