"""Each run its own folder under work_dir (distributed_runner/core/run_folders.py): runs of one
config never mix their logs or delete each other's checkpoints; ``--resume`` continues the newest
run that has a checkpoint, in its folder; ``drun plot`` draws the newest run, ``--all`` every
run; every rank of a run writes into the one folder rank 0 named."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from distributed_runner import Runner
from distributed_runner.core.run_folders import new_run_name, runs_newest_first
from distributed_runner.tracking.plot import expand_runs, series
from tests.toy import base_cfg, free_port, gloo_rank

ROOT = Path(__file__).resolve().parents[2]


def cfg_of(work_dir: Path, epochs: int = 2, **overrides):
    """The toy config with its default run naming (base_cfg pins run_name='.'), keeping two
    periodic checkpoints."""
    cfg = base_cfg(work_dir, train_cfg=dict(by_epoch=True, max_epochs=epochs, val_interval=1),
                   **overrides)
    if "run_name" not in overrides:
        cfg.pop("run_name")
    cfg["default_hooks"]["checkpoint"] = dict(type="CheckpointHook", interval=1,
                                              max_keep_ckpts=1)
    return cfg


def test_two_runs_of_one_config_get_a_folder_each_and_keep_their_checkpoints(tmp_path):
    first = Runner.from_cfg(cfg_of(tmp_path))
    first.train()
    second = Runner.from_cfg(cfg_of(tmp_path))
    second.train()
    assert first.work_dir != second.work_dir
    assert first.work_dir.parent == second.work_dir.parent == tmp_path
    assert first.experiment_name == second.experiment_name == tmp_path.name
    for runner in (first, second):  # max_keep_ckpts=1 counted each run's own checkpoints
        assert sorted(p.name for p in runner.work_dir.glob("epoch_*.pth")) == ["epoch_2.pth"]
        records = [json.loads(line) for line in
                   (runner.work_dir / "logs" / "scalars.jsonl").read_text().splitlines()]
        steps = [r["step"] for r in records if r["mode"] == "train"]
        assert steps == sorted(set(steps)) and steps[-1] == 20  # one run's records, once each
    assert runs_newest_first(tmp_path) == [second.work_dir, first.work_dir]


def test_resume_continues_the_newest_run_with_a_checkpoint_in_its_folder(tmp_path):
    done = Runner.from_cfg(cfg_of(tmp_path, epochs=2))
    done.train()
    time.sleep(0.05)
    # a newer run that failed before its first checkpoint: nothing to resume there
    crashed = tmp_path / new_run_name(tmp_path)
    (crashed / "logs").mkdir()
    (crashed / "logs" / "run.log").write_text("failed at start\n")
    resumed = Runner.from_cfg(cfg_of(tmp_path, epochs=3, resume=True))
    assert resumed.work_dir == done.work_dir and resumed.run_name == done.work_dir.name
    resumed.train()
    assert resumed.epoch == 3 and (done.work_dir / "epoch_3.pth").is_file()
    # an explicit checkpoint of a run resumes in that run's folder
    again = Runner.from_cfg(cfg_of(tmp_path, epochs=4, resume=str(done.work_dir / "epoch_3.pth")))
    assert again.work_dir == done.work_dir


def test_resume_with_no_run_yet_starts_a_new_one_and_a_flat_work_dir_resumes_flat(tmp_path):
    fresh = Runner.from_cfg(cfg_of(tmp_path / "new", resume=True))
    assert fresh.work_dir.parent == tmp_path / "new"
    flat = base_cfg(tmp_path / "old", train_cfg=dict(by_epoch=True, max_epochs=1))
    Runner.from_cfg(flat).train()  # run_name='.': the layout of earlier versions
    assert (tmp_path / "old" / "epoch_1.pth").is_file()
    resumed = Runner.from_cfg(cfg_of(tmp_path / "old", epochs=2, resume=True))
    assert resumed.work_dir == tmp_path / "old" and resumed.run_name == "."


def test_runs_starting_in_the_same_second_get_distinct_names(tmp_path):
    now = time.time()
    names = [new_run_name(tmp_path, now) for _ in range(3)]
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now))
    assert names == [stamp, f"{stamp}_2", f"{stamp}_3"]


@pytest.mark.parametrize("name,fragment", [
    ("a/b", "is not a folder name"), ("..", "is not a folder name"),
    ("ray_storage", "a folder drun keeps for something else")])
def test_a_run_name_that_is_not_a_folder_is_one_line(tmp_path, name, fragment):
    from distributed_runner.core.errors import ConfigError

    with pytest.raises(ConfigError, match=fragment) as e:
        Runner.from_cfg(cfg_of(tmp_path, run_name=name))
    assert str(e.value).startswith("run_name: ")


def drun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distributed_runner.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow("five drun subprocesses in one work_dir")
def test_drun_name_then_the_same_name_needs_resume_and_plot_draws_the_newest_or_all(tmp_path):
    config = str(ROOT / "configs" / "digits_cnn.py")
    options = ["--cfg-options", "train_cfg.max_epochs=1", "param_scheduler=None"]
    first = drun("train", config, "--work-dir", str(tmp_path), "--name", "base", *options)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "base" / "last.pth").is_file()
    again = drun("train", config, "--work-dir", str(tmp_path), "--name", "base", *options)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"drun: error: run_name: {tmp_path / 'base'} already holds run 'base' and its "
        f"checkpoints: add --resume to continue it, or choose another --name"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # nothing written
    time.sleep(1.1)
    second = drun("train", config, "--work-dir", str(tmp_path), *options)
    assert second.returncode == 0, second.stderr
    (newest,) = [p for p in tmp_path.iterdir() if p.name != "base"]
    assert expand_runs([tmp_path]) == [newest]
    assert expand_runs([tmp_path], every_run=True) == [tmp_path / "base", newest]
    plotted = drun("plot", str(tmp_path), "--all", "--out", str(tmp_path / "all.png"))
    assert plotted.returncode == 0 and (tmp_path / "all.png").is_file(), plotted.stderr
    assert drun("plot", str(tmp_path)).returncode == 0 and (newest / "curves.png").is_file()
    steps, _ = series(newest)[("train", "loss")]
    assert steps == [20, 40]  # that run alone: one epoch of 45 iterations, logged every 20
    empty = drun("plot", str(tmp_path / "nothing"))
    assert empty.returncode == 2 and "no run with logs in" in empty.stderr


def _two_ranks_name_one_run(rank: int, port: int, work_dir: str) -> None:
    with gloo_rank(rank, port):
        if rank == 1:
            time.sleep(1.1)  # a second later: its own clock would name another folder
        runner = Runner.from_cfg(cfg_of(Path(work_dir), epochs=1))
        runner.train()
        Path(work_dir, f"rank{rank}.txt").write_text(str(runner.work_dir))


def test_every_rank_writes_into_the_folder_rank_0_named(tmp_path):
    mp.start_processes(_two_ranks_name_one_run, args=(free_port(), str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    folders = {(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)}
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == 1 and [str(p) for p in runs] == list(folders)
    assert torch.load(runs[0] / "epoch_1.pth", weights_only=True)["meta"]["world_size"] == 2
    assert os.listdir(runs[0] / "logs")
