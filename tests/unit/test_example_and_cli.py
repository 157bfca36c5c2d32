"""The digits example reaches >= 95 % validation accuracy; ``drun`` train/test/hooks work and
user mistakes exit 2 with one line on stderr."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_runner import Config, Runner
from tests.docs_blocks import docs_block, docs_commands

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "digits_cnn.py"


def docs_train_command() -> list[str]:
    """Getting started's ``drun train``, after its install commands."""
    return docs_commands("train-example")[0].split(" && ")[-1].split()


def drun(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "distributed_runner.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_digits_example_reaches_95_percent(tmp_path):
    cfg = Config.fromfile(CONFIG, cfg_options=[f"work_dir={tmp_path}"])
    start = time.perf_counter()
    runner = Runner.from_cfg(cfg)
    runner.train()
    elapsed = time.perf_counter() - start
    best = runner.get_hook("checkpoint").best_scores["accuracy"]
    assert best >= 95.0
    assert elapsed < 60, f"the example took {elapsed:.1f}s"
    assert runner.test()["accuracy"] >= 95.0
    run = runner.work_dir  # the run's own folder under work_dir, named by its start time
    assert run.parent == tmp_path and [p.name for p in tmp_path.iterdir()] == [run.name]
    assert sorted(p.name for p in run.glob("epoch_*.pth")) == ["epoch_12.pth", "epoch_8.pth"]
    # what "Reading the output" lists in the run's folder is there (N: any epoch)
    for line in docs_block("work-dir-layout").splitlines():
        name = line.split()[0].removeprefix("work_dirs/digits_cnn/RUN/").replace("_N.", "_*.")
        assert list(run.glob(name)), name


def test_cli_hooks_prints_the_plan():
    out = drun("hooks", str(CONFIG))
    assert out.returncode == 0, out.stderr
    assert "checkpoint       CheckpointHook           VERY_LOW (90)" in out.stdout
    assert "after_train_iter" in out.stdout


@pytest.mark.slow("drun train, test and resume as subprocesses")
def test_cli_train_then_test_then_resume(tmp_path):
    command = docs_train_command()  # the docs' command, as written, plus options
    assert command[:2] == ["drun", "train"] and ROOT / command[2] == CONFIG
    out = drun(*command[1:], "--work-dir", str(tmp_path),
               "--cfg-options", "train_cfg.max_epochs=2", "param_scheduler=None")
    assert out.returncode == 0, out.stderr
    (run,) = tmp_path.iterdir()  # the run's folder
    assert (run / "last.pth").is_file() and (run / "config.py").is_file()
    out = drun("test", str(CONFIG), "--work-dir", str(tmp_path / "test"),
               "--checkpoint", str(run / "last.pth"))
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert metrics["accuracy"] > 50
    out = drun("train", str(CONFIG), "--work-dir", str(tmp_path), "--resume",
               "--cfg-options", "train_cfg.max_epochs=3", "param_scheduler=None")
    assert out.returncode == 0, out.stderr
    assert "resumed from" in out.stdout and "Epoch(train) [3]" in out.stdout
    assert "Epoch(train) [1]" not in out.stdout
    assert [p.name for p in tmp_path.iterdir() if p.name != "test"] == [run.name]  # continued


@pytest.mark.parametrize("args,fragment", [
    (["train", "no_such_config.py"], "config file not found"),
    (["train", str(CONFIG), "--cfg-options", "model.type=DigitCNN"],
     "model.type: unknown model 'DigitCNN' (did you mean 'DigitsCNN'"),
    (["test", str(CONFIG), "--checkpoint", "missing.pth"], "load_from: checkpoint"),
    (["train", str(CONFIG), "--cfg-options", "default_hooks.checkpoint.priority=SOON"],
     "default_hooks.checkpoint.priority: unknown priority 'SOON'"),
])
def test_cli_user_errors_are_one_line_exit_2(tmp_path, args, fragment):
    args = [a if a != "missing.pth" else str(tmp_path / "missing.pth") for a in args]
    if args[0] in ("train", "test"):
        args += ["--work-dir", str(tmp_path)] if "--work-dir" not in args else []
    out = drun(*args)
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("drun: error: ") and fragment in err[0], out.stderr


def test_the_strategy_flag_keeps_the_options_the_chosen_strategy_takes():
    from distributed_runner.cli import override_strategy
    from distributed_runner.model.sharding import parse_strategy
    fsdp = dict(type="fsdp", shard_modules=["Block"], checkpoint="full",
                activation_checkpointing=["Block"])
    assert override_strategy(fsdp, "fsdp") == fsdp
    # DDP takes only activation_checkpointing from a strategy dict: the rest is dropped
    assert override_strategy(fsdp, "ddp") == dict(type="ddp", activation_checkpointing=["Block"])
    assert parse_strategy(override_strategy(fsdp, "ddp"))["activation_checkpointing"] == ["Block"]
    assert override_strategy(dict(type="fsdp", shard_modules=["Block"]), "ddp") == "ddp"
    assert override_strategy(None, "fsdp") == "fsdp"
    assert override_strategy("ddp", "fsdp") == "fsdp"
