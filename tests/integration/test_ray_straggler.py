"""StragglerHook through Ray Train (CPU, gloo, 2 workers): rank 1, made 3x slower before the
step's collective, is named in the run's log with its ratio, and the per-rank figures reach the
JSON lines. (A uniform Ray run naming none: test_ray_train.py's uninterrupted run.)"""
import json
import re

import pytest

from distributed_runner.launch.launcher import RayLauncher, normalize_launcher
from tests.toy import base_cfg

pytestmark = [pytest.mark.integration, pytest.mark.slow("a Ray run with a rank made slow on purpose"),
              pytest.mark.timeout(240)]


@pytest.mark.serial("measures a 3x step-time ratio between two Ray workers")
def test_a_rank_made_three_times_slower_is_named_with_its_ratio(ray_cluster, tmp_path):
    cfg = base_cfg(tmp_path, val_dataloader=None, val_evaluator=None, val_cfg=None,
                   train_cfg=dict(by_epoch=False, max_iters=20),
                   custom_imports=dict(imports=["tests.slow_rank"]),
                   launcher=dict(type="ray", num_workers=2),
                   # the record at iteration 10 names it (15 when the first window, which
                   # holds DDP's bucket rebuild, was not over the ratio): the patience comes
                   # from the config
                   watchdog=dict(straggler_patience=2),
                   default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                                      checkpoint=dict(type="CheckpointHook", interval=5,
                                                      by_epoch=False)),
                   custom_hooks=[dict(type="SlowRankHook", rank=1, base=0.1, factor=3.0)])
    RayLauncher(cfg, normalize_launcher(cfg["launcher"])).fit()
    log = (tmp_path / "logs" / "run.log").read_text()
    named = [line for line in log.splitlines() if "straggler: rank" in line]
    assert len(named) == 1, named  # once per episode
    at = re.search(r"straggler: rank 1 at iteration (10|15): ", named[0])
    assert at, named[0]
    assert "for 2 logging windows in a row" in named[0]
    ratio = float(re.search(r"iteration 1[05]: ([0-9.]+)x the median", named[0]).group(1))
    assert ratio > 2, named[0]  # over watchdog.straggler_ratio; the exact figure is below
    records = [json.loads(line) for line in (tmp_path / "logs" / "scalars.jsonl").open()]
    train = [r for r in records if r["mode"] == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    # the first record holds DDP's bucket rebuild (hooks/straggler_hook.py). The spread is the
    # ratio of the ranks' seconds, (3 base + c) / (base + c), and falls with the step's own time c
    # on a loaded machine (2.22 seen); their difference is the 2 x base rank 1 sleeps longer
    for r in train[1:]:
        assert r["straggler/slowest_rank"] == 1.0 and r["straggler/spread"] > 2
        assert r["straggler/spread"] == r["straggler/rank_1_s"] / r["straggler/rank_0_s"]
        assert 0.175 < r["straggler/rank_1_s"] - r["straggler/rank_0_s"] < 0.24  # 2 x base
