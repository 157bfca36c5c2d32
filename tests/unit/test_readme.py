"""The README's runnable examples (blocks marked ``<!-- readme-test: NAME -->``) work as written."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def blocks() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    found = re.findall(r"<!-- readme-test: ([\w-]+) -->\s*```python\n(.*?)```", text, re.S)
    return dict(found)


def test_readme_has_the_marked_examples():
    assert set(blocks()) == {"custom-hook", "runner-api", "hook-library", "seed-hooks"}


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
    assert (tmp_path / "work_dirs" / "readme_example" / "last.pth").is_file()


def test_hook_library_example_runs(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", blocks()["hook-library"]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    work_dir = tmp_path / "work_dirs" / "hook_library_example"
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
