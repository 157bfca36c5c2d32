"""Fuzz: well over 100 wrong configs, options and files derived from the example, each given to
``drun train`` in-process. Every one must end with exit status 2, exactly one line on stderr
(``drun: error: <key>: ...``), no traceback, and nothing trained — the bad input loses nothing
and names what to fix."""
import contextlib
import io
from pathlib import Path

import pytest

from distributed_runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "configs" / "digits_cnn.py")

# (key, wrong values as --cfg-options literals): types and ranges of engine-owned keys
WRONG_VALUES = {
    "train_cfg.max_epochs": ["0", "-1", "2.5", "'3'", "True", "None", "'ten'", "inf", "[1]"],
    "train_cfg.val_interval": ["0", "-1", "'1ep'", "1.5", "False"],
    "train_cfg.val_begin": ["0", "'x'"],
    "train_cfg.by_epoch": ["'yes'", "1", "None"],
    "train_cfg.agree_every": ["0", "'sometimes'"],
    "train_dataloader.batch_size": ["0", "-4", "'32'", "32.5", "True", "None"],
    "train_dataloader.num_workers": ["-1", "1.5", "'2'"],
    "train_dataloader.drop_last": ["'no'"],
    "val_dataloader.batch_size": ["0", "'big'"],
    "optim_wrapper.optimizer.lr": ["-1", "'1e-3'", "nan", "inf", "True", "[0.1]"],
    "optim_wrapper.optimizer.momentum": ["-0.5", "'high'"],
    "optim_wrapper.optimizer.weight_decay": ["-1"],
    "optim_wrapper.optimizer.type": ["'Adamm'", "5"],
    "optim_wrapper.clip_grad": ["'yes'", "5", "{'max_norm': -1}", "{'max_norm': 'x'}"],
    "optim_wrapper.accumulative_counts": ["0", "'2'"],
    "randomness.seed": ["'abc'", "1.5", "-1", "True"],
    "randomness.deterministic": ["'yes'"],
    "randomness.sede": ["1"],
    "device": ["'cuda'", "'gpu'", "'cuda:7'", "5"],
    "log_level": ["'LOUD'", "1.5", "[1]"],
    "default_hooks.checkpoint.interval": ["0", "-2", "1.5", "True", "'soon'"],
    "default_hooks.checkpoint.max_keep_ckpts": ["'2'", "1.5", "-3"],
    "default_hooks.checkpoint.save_best": ["'acc'", "['accuracy', 'loss']"],
    "default_hooks.checkpoint.type": ["'CheckpointHok'"],
    "default_hooks.checkpoint.save_topk": ["0"],
    "default_hooks.logger.interval": ["0", "-1", "'often'"],
    "default_hooks.logger.sinks": ["['jsnol']", "['terminal', 'tensorbored']"],
    "default_hooks.logger.intervl": ["5"],
    "model.type": ["'DigitCNN'", "None"],
    "model.width": ["-3", "'wide'"],
    "model.depth": ["3"],
    "train_dataloader.dataset.type": ["'DigitsDatset'"],
    "train_dataloader.sampler.type": ["'DefaultSampeler'"],
    "val_evaluator.type": ["'Acuracy'"],
    "val_evaluator.topk": ["0"],
    "param_scheduler.0.type": ["'LinerLR'"],
    "param_scheduler.0.bgein": ["0"],
    "launcher": ["'slurm'", "{'type': 'ray', 'num_workers': 0}",
                 "{'type': 'ray', 'num_worker': 2}", "{'type': 'ray', 'use_gpu': True, "
                 "'placement_strategy': 'TIGHT'}"],
    "custom_hooks": ["'EMAHook'", "[{'type': 'EMAHok'}]",
                     "[{'type': 'EarlyStoppingHook', 'monitor': 'acc'}]",
                     "[{'type': 'EMAHook', 'momentum': 'fast'}]"],
    "default_hooks": ["['logger']"],
    "train_cfg": ["5"],
    "optim_wrapper": ["'sgd'"],
    "randomness": ["7"],
    "val_cfg": ["'fast'"],
    "custom_imports": ["5", "{'imports': 5}"],
    "preemption": ["5", "'yes'", "{'grace_period': 'x'}", "{'signals': 5}"],
}
TYPO_KEYS = ["trian_cfg", "optim_wraper", "defualt_hooks", "val_evalutor", "param_schedular",
             "custom_hook", "randomnes", "val_cfgs", "model_wrapper", "train_dataloaders"]
MALFORMED_OPTIONS = ["x=[1,2", "=5", "__class__=5", "a..b=1", "noequals",
                     "train_cfg.max_epochs=(1,", "train_cfg.__dict__=1"]
BAD_FILES = {
    "raises.py": "model = dict(type='DigitsCNN')\nraise RuntimeError('misconfigured on purpose')\n",
    "imports.py": "import this_module_does_not_exist\nmodel = dict(type='DigitsCNN')\n",
    "syntax.py": "model = dict(type='DigitsCNN'\n",
    "custom_import.py": "custom_imports = dict(imports=['no_such_package.hooks'])\n"
                        "model = dict(type='DigitsCNN')\n",
    "list.yaml": "- just\n- a list\n",
    "broken.yaml": "model: {type: DigitsCNN\n",
    "base_cycle.py": "_base_ = 'base_cycle.py'\n",
    "missing_base.py": "_base_ = 'nowhere.py'\n",
    "config.txt": "model = 1\n",
}


def cases():
    for key, values in WRONG_VALUES.items():
        for value in values:
            yield f"{key}={value}", (EXAMPLE, [f"{key}={value}"])
    for key in TYPO_KEYS:
        yield f"{key}=...", (EXAMPLE, [f"{key}={{'max_epochs': 1}}"])
    for option in MALFORMED_OPTIONS:
        yield f"option {option}", (EXAMPLE, [option])
    for name in BAD_FILES:
        yield f"file {name}", (name, [])


CASES = list(cases())


def test_there_are_over_100_mutations():
    assert len(CASES) >= 100, len(CASES)


def run_drun(config: str, options: list[str], work_dir: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", config, "--work-dir", str(work_dir),
                     *(["--cfg-options", *options] if options else [])])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name,case", CASES, ids=[name for name, _ in CASES])
def test_every_wrong_input_is_one_line_exit_2_and_nothing_trains(name, case, tmp_path):
    config, options = case
    if config in BAD_FILES:
        (tmp_path / config).write_text(BAD_FILES[config])
        config = str(tmp_path / config)
    work_dir = tmp_path / "wd"
    code, out, err = run_drun(config, options, work_dir)  # anything but ConfigError raises here
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("drun: error: "), (code, err)
    assert "Traceback" not in out + err
    assert not list(work_dir.glob("*.pth")) and "Epoch(train)" not in out, "it trained"
