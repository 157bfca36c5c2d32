"""The runnable examples of the docs and the README (blocks marked ``<!-- docs-test: NAME -->``,
see ``tests/docs_blocks.py``) work as written."""
import os
import shlex
import subprocess
import sys

import pytest

from tests.docs_blocks import ROOT, docs_block, docs_commands

EXAMPLES = ("custom-hook", "runner-api", "hook-library", "seed-hooks")


def blocks() -> dict[str, str]:
    return {name: docs_block(name) for name in EXAMPLES}


def test_the_docs_have_the_marked_examples():
    assert all(code.strip() for code in blocks().values())


def test_the_readmes_example_and_commands_are_the_docs_tested_ones():
    """The README repeats the first hook and the two commands; the docs' copies run."""
    assert docs_block("readme-custom-hook") == docs_block("custom-hook")
    train = docs_commands("train-example")[0].split(" && ")[-1]
    ray = docs_commands("ray-local")[0]
    assert docs_commands("readme-commands") == [docs_commands("train-example")[0], ray]
    assert train == "drun train configs/digits_cnn.py"


def test_the_ray_config_asks_for_what_the_ray_flags_ask_for():
    """``drun train configs/digits_cnn_ray.py`` is the flags' run, from the config."""
    from distributed_runner import Config
    from distributed_runner.cli import apply_launcher_flags, build_parser
    from distributed_runner.launch.launcher import normalize_launcher

    flags, from_config = docs_commands("ray-local")
    args = build_parser().parse_args(shlex.split(flags)[1:])
    cfg = Config.fromfile(ROOT / args.config)
    apply_launcher_flags(cfg, args)
    other = Config.fromfile(ROOT / shlex.split(from_config)[2])
    for key in ("type", "num_workers", "use_gpu"):
        assert normalize_launcher(cfg["launcher"])[key] == \
            normalize_launcher(other["launcher"])[key], key


@pytest.mark.slow("runs the docs' example scripts")
def test_custom_hook_and_runner_api_examples_run(tmp_path):
    code = blocks()
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    script = code["custom-hook"] + "\n" + code["runner-api"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("{'accuracy': ")
    assert float(last.split(": ")[1].rstrip("}")) > 80
    assert "check_invalid_loss" in out.stdout  # the hook plan lists the README's hook
    # 2 epochs, the config saves every 4: the final state is kept as last.pth
    assert len(list((tmp_path / "work_dirs" / "readme_example").glob("*/last.pth"))) == 1


@pytest.mark.slow("runs the docs' example scripts")
def test_hook_library_example_runs(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", blocks()["hook-library"]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (work_dir,) = (tmp_path / "work_dirs" / "hook_library_example").iterdir()  # the run
    assert sorted(p.name for p in (work_dir / "vis").glob("*.png")) == ["val_iter_180.png",
                                                                       "val_iter_90.png"] \
        or "early stopping" in out.stdout
    assert len(list(work_dir.glob("best_accuracy_*.pth"))) == 2
    assert "HookTiming(name=" in out.stdout.splitlines()[-1]
    assert "ema" in out.stdout  # the hook plan is logged at startup


def test_seed_hook_examples_run_as_written(tmp_path):
    import tests.toy  # noqa: F401
    from tests.toy import make_runner

    lines = [line for line in blocks()["seed-hooks"].splitlines() if line.strip()]
    assert len(lines) == 5
    for i, line in enumerate(lines):
        namespace: dict = {}
        exec(line, namespace)
        runner = make_runner(tmp_path / str(i), custom_hooks=namespace["custom_hooks"],
                             train_cfg=dict(by_epoch=True, max_epochs=2))
        runner.train()
        assert runner.iter == 20
    assert list((tmp_path / "3" / "tf_tracing_logs").glob("*.pt.trace.json"))
