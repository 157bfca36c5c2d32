"""The benchmarks run (their figures are read by people, never asserted here)."""
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow("runs each benchmark script end to end, reduced")
ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str) -> subprocess.CompletedProcess:
    """``python benchmarks/<name>.py *args`` from the repository root; it must exit 0."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_hook_overhead_benchmark_runs_the_users_path():
    out = run_benchmark("hook_overhead", "--only-user-path", "--user-rounds", "1", "--epochs", "2")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("user path: per-sample dict dataset")
    assert len(lines) == 2 and lines[1].startswith("bare loop")
    assert "| Runner" in lines[1] and "median of pair differences" in lines[1]


def test_overhead_parts_benchmark_adds_one_part_per_line():
    out = run_benchmark("overhead_parts", "--rounds", "1", "--epochs", "2")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("overhead parts: the user path") and "1 pairs each" in lines[0]
    assert [line.split(" ")[0] for line in lines[1:]] == ["loop,"] + ["+"] * 4
    assert all(" us/iter (quartiles " in line and "| part " in line for line in lines[1:])
    assert lines[-1].startswith("+ the records written")


def test_overhead_parts_empties_only_the_per_iteration_methods():
    sys.path.insert(0, str(ROOT))
    from benchmarks.overhead_parts import emptied
    from distributed_runner.engine.hook import overrides
    from hooks import IterTimerHook, ParamSchedulerHook

    timer = emptied(IterTimerHook)
    # still dispatched at both mount points, but doing nothing (the real ones read the runner)
    assert overrides(timer, "before_train_iter") and overrides(timer, "after_train_iter")
    timer.before_train_iter(None, 0)
    timer.after_train_iter(None, 0)
    with pytest.raises(AttributeError):
        IterTimerHook().before_train_iter(None, 0)
    assert type(timer).before_train is IterTimerHook.before_train
    assert "before_train_iter" not in vars(type(emptied(ParamSchedulerHook)))


def test_dispatch_cost_benchmark_runs():
    out = run_benchmark("dispatch_cost")
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(" ns/call" in line for line in lines)
    assert "50 hooks registered" in lines[1] and "ratio" in lines[1]


def test_logging_overhead_benchmark_runs_with_the_mlflow_sink():
    out = run_benchmark("logging_overhead", "--epochs", "2", "--pairs", "1")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("digits CNN, batch 32") and lines[1].startswith("logging off")
    assert lines[2].startswith("MLflow sink, interval 1") and " metrics dropped" in lines[2]
    assert lines[3].startswith("per pair of runs") and lines[3].count(".") == 2  # 1 pair, median


def test_agreement_overhead_benchmark_runs_on_two_processes():
    out = run_benchmark("agreement_overhead", "--rounds", "1")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("2 gloo processes") and "'auto' chose every" in lines[-1]
    assert sum("ratio to never" in line for line in lines) == 3


def test_distributed_parts_benchmark_adds_one_part_per_line_on_two_processes():
    out = run_benchmark("distributed_parts", "--rounds", "1", "--epochs", "3")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("distributed parts: 2 gloo processes") and "2 pairs" in lines[0]
    assert lines[1].startswith("plain DDP loop: training thread")
    rows = lines[3:-1]
    assert [row.split(" ")[0] for row in rows] == ["loop,"] + ["+"] * 4
    assert all(row.endswith(" us/iter") for row in rows)
    assert rows[-1].startswith("+ the records written")
    assert lines[-1].startswith("the defaults: training thread CPU")


def test_checkpoint_verify_benchmark_runs():
    out = run_benchmark("checkpoint_verify", "--mb", "8", "--rounds", "2")
    assert out.stdout.startswith("load and restore a 8 MB checkpoint (median of 2, interleaved)")
    assert "| ratio " in out.stdout


def test_gpu_throughput_benchmark_runs_reduced_on_the_cpu():
    out = run_benchmark("gpu_throughput", "--smoke")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("gpu throughput: ") and "default hooks" in lines[0]
    assert [line.split(" ")[0] for line in lines[1:]] == ["resnet50", "gpt2"]
    for line, unit in zip(lines[1:], ("images/s", "tokens/s")):
        assert "eager: raw " in line and f"{unit} | Runner " in line and "| ratio " in line


def test_checkpoint_stall_benchmark_runs():
    out = run_benchmark("checkpoint_stall", "--mb", "2", "--iters", "8", "--every", "4")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("checkpoint stall: ")
    assert [line.split()[0] for line in lines[1:]] == ["ddp", "fsdp"]
    assert all("| async/sync: stall " in line for line in lines[1:])


def test_gpu_throughput_benchmark_runs_the_hugging_face_gpt2_on_the_cpu():
    pytest.importorskip("transformers")
    out = run_benchmark("gpu_throughput", "--smoke", "--models", "hf-gpt2")
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith("hf-gpt2 (batch 2 x 32 tokens) eager: raw ")
    assert "tokens/s | Runner " in lines[1] and "| ratio " in lines[1]


@pytest.mark.parametrize("model", ["gpt", "hf-gpt2"])
def test_activation_checkpointing_benchmark_runs(model):
    if model == "hf-gpt2":
        pytest.importorskip("transformers")
    out = run_benchmark("activation_checkpointing", "--smoke", "--model", model)
    lines = out.stdout.splitlines()
    block = "Block" if model == "gpt" else "GPT2Block"
    assert lines[0].startswith("activation checkpointing: ") and f"| {model} width 32" in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == [
        "without", f"with activation_checkpointing=['{block}']", "with/without"]
    assert all("saved for backward " in line and "| step " in line for line in lines[1:3])
    assert "| step time " in lines[3]


def test_async_validation_benchmark_runs_both_modes():
    out = run_benchmark("async_validation", "--epochs", "4", "--width", "8", "--val-repeat", "2",
                        "--rounds", "1")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("async validation: digits CNN width 8, 4 epochs")
    assert lines[1].startswith("inline  step ") and lines[2].startswith("async   step ")
    assert lines[3].startswith("async/inline: training loop ")


def test_streaming_data_benchmark_runs_its_table(tmp_path):
    out = run_benchmark("streaming_data", "--rows", "20000", "--memory-rows", "20000",
                        "--skip-ray-data", "--work-dir", str(tmp_path), "--startup-files",
                        "300", "--latency-ms", "1")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("streaming_data: batch 256")
    startup = [line for line in lines if line.startswith("| 300 | ")]
    assert [r.split(" | ")[1] for r in startup] == ["footers", "index",
                                                  "index, windows one by one"]
    # today's reader: the listing (2 requests) and a footer per file; with the index, none
    assert startup[0].split(" | ")[2] == "302" and startup[1].split(" | ")[2] == "0"
    lines = lines[:lines.index(next(x for x in lines if x.startswith("startup: ")))]
    assert lines[1].startswith("| data | reader | samples/s |")
    rows = [line for line in lines[3:] if line.startswith("| ")]
    assert [r.split(" | ")[1] for r in rows] == ["streaming", "streaming"]
    assert "error" not in out.stdout and rows[0].count(" / ") == 2


def test_load_pretrained_benchmark_runs_both_paths():
    pytest.importorskip("transformers")
    out = run_benchmark("load_pretrained", "--smoke")
    lines = out.stdout.splitlines()
    assert lines[0].startswith("load pretrained: Llama hidden 64, 2 layers")
    assert [line.split(" ")[0] for line in lines[2:6]] == (
        ["load_from"] * 2 + ["from_pretrained"] * 2)
    assert lines[6].startswith("worst ratio to size/world: ")
    assert lines[6].endswith("the same local shards on every rank")
