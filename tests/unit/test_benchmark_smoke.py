"""The hook-overhead benchmark runs (its figures are read by people, never asserted here)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hook_overhead_benchmark_runs_the_users_path():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hook_overhead.py"),
                          "--only-user-path", "--user-rounds", "1", "--epochs", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("user path: per-sample dict dataset")
    assert len(lines) == 2 and lines[1].startswith("bare loop")
    assert "| Runner" in lines[1] and "median of pair differences" in lines[1]
