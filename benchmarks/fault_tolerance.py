"""What a lost worker costs: fault tolerance's replicas against the restart every run has, and
what the per-step quorum costs, side by side in one run.

    python benchmarks/fault_tolerance.py [--epochs 4] [--kill-at 60] [--skip-ray] [--hsdp]
                                         [--work-dir DIR]

(``--skip-ray``: the local replicas' runs only; ``--hsdp``: the HSDP rows too.)

The users' path: ``configs/digits_cnn.py`` (per-sample dataset, the default hooks) with its
global batch of 32 on 2 processes, a checkpoint every 20 iterations. Six runs:

* **replicas**: ``fault_tolerance=dict(replicas=2, heartbeat_timeout=1.0)`` (``batch_size=16``
  each), no failure: the median seconds per iteration;
* **replicas, killed**: the same with replica 1 SIGKILLed at iteration ``--kill-at``: progress
  lost is the seconds from the kill until the survivor has committed that iteration;
* **replicas on Ray** (and **killed**): the same as 2 Ray actors (``launcher=dict(type='ray',
  num_workers=2)``), the lighthouse in the driver, the killed actor replaced alone;
* **HSDP replica groups** (and **killed**): 2 replica groups of 2 FSDP processes each
  (``ranks_per_replica=2``, ``batch_size=8`` a rank: the same global batch of 32), rank 0 of
  group 1 SIGKILLed: its group is replaced whole (4 processes on the machine's cores);
* **Ray DDP**: 2 Ray Train workers (``batch_size=16`` each), no failure: the median seconds
  per iteration, the same run without a quorum;
* **Ray DDP, killed**: rank 1 SIGKILLed at iteration ``--kill-at``, ``max_failures=1``: Ray
  restarts the group, which resumes the newest checkpoint; progress lost is the seconds from
  the kill until the run has committed that iteration again.

Each run's clock is a hook (``IterationClock``) that stamps every committed iteration on every
process; the kill is a hook too (``KillAt``), which writes the time before it kills.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hooks import HOOKS, Hook  # noqa: E402


def _who(runner) -> int:
    """The replica slot (a replica group's rank 0 only: -1 for its others), else the rank."""
    if runner.replicas is None:
        return runner.rank
    return runner.replicas.slot if runner.rank == 0 else -1


@HOOKS.register_module(force=True)
class IterationClock(Hook):
    """Appends ``{"t", "who", "iter"}`` after each iteration (committed: a replica's step
    returns only then) to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_train_iter(self, runner, batch_idx=None, data_batch=None, outputs=None) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"t": time.time(), "who": _who(runner), "iter": runner.iter}) + "\n")


@HOOKS.register_module(force=True)
class KillAt(Hook):
    """SIGKILLs process ``who`` (replica slot or rank) before iteration ``at`` (1-based), once:
    ``marker`` then holds the time of the kill."""

    def __init__(self, who: int, at: int, marker: str) -> None:
        self.who, self.at, self.marker = who, at, Path(marker)

    def before_train_iter(self, runner, batch_idx=None, data_batch=None) -> None:
        if _who(runner) == self.who and runner.iter + 1 == self.at and not self.marker.exists():
            self.marker.write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


def config(work: Path, epochs: int, kill_at: int | None, kind: str) -> dict:
    """``kind``: 'replicas' (local processes), 'ray_replicas' (Ray actors) or 'ray_ddp'."""
    from distributed_runner.core.config import Config

    cfg = Config.fromfile(str(ROOT / "configs" / "digits_cnn.py")).to_dict()
    cfg["custom_imports"] = dict(imports=["distributed_runner.examples.digits",
                                          "benchmarks.fault_tolerance"])
    cfg.update(work_dir=str(work), log_level="WARNING", val_dataloader=None, val_evaluator=None,
               val_cfg=None, test_dataloader=None, test_evaluator=None, test_cfg=None)
    cfg["train_cfg"] = dict(by_epoch=True, max_epochs=epochs)
    cfg["param_scheduler"] = None
    cfg["train_dataloader"]["batch_size"] = 16  # x 2 processes: the config's 32
    cfg["default_hooks"]["checkpoint"] = dict(type="CheckpointHook", by_epoch=False, interval=20)
    hooks = [dict(type="IterationClock", path=f"{work}.clock")]
    if kill_at:
        hooks.append(dict(type="KillAt", who=1, at=kill_at, marker=f"{work}.killed"))
    cfg["custom_hooks"] = hooks
    if kind != "ray_ddp":
        cfg["fault_tolerance"] = dict(mode="replicas", replicas=2, heartbeat_timeout=1.0)
    if kind == "hsdp_replicas":
        cfg["train_dataloader"]["batch_size"] = 8  # x 2 ranks x 2 replica groups
        cfg["strategy"] = dict(type="fsdp")
        cfg["fault_tolerance"]["ranks_per_replica"] = 2
    if kind == "ray_replicas":
        cfg["launcher"] = dict(type="ray", num_workers=2)
    if kind == "ray_ddp":
        cfg["launcher"] = dict(type="ray", num_workers=2, max_failures=1)
    return cfg


def run(work: Path, epochs: int, kill_at: int | None, kind: str) -> list[dict]:
    from distributed_runner.engine.config_prep import prepare_config
    from distributed_runner.launch.launcher import run as launch

    started = time.time()
    if launch(prepare_config(config(work, epochs, kill_at, kind))[0]) != 0:
        raise RuntimeError(f"the run in {work} failed")
    print(f"  {work.name}: {time.time() - started:.1f} s", flush=True)
    return [json.loads(line) for line in Path(f"{work}.clock").read_text().splitlines()]


def step_seconds(clock: list[dict]) -> float:
    """Median seconds between process 0's consecutive iterations (the first epoch's first 5 left
    out: start-up)."""
    times = [r["t"] for r in clock if r["who"] == 0][5:]
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def progress_lost(work: Path, clock: list[dict], kill_at: int) -> float:
    """Seconds from the kill until iteration ``kill_at`` was committed (after the kill)."""
    killed = float(Path(f"{work}.killed").read_text())
    done = [r["t"] for r in clock if r["iter"] == kill_at - 1 and r["t"] > killed]
    return min(done) - killed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=60)
    parser.add_argument("--skip-ray", action="store_true", help="the replicas' runs only")
    parser.add_argument("--hsdp", action="store_true", help="and the HSDP replica groups")
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    base = Path(args.work_dir or tempfile.mkdtemp(prefix="drun-ft-bench-"))
    rows = []
    kinds = [("replicas", "replicas (torchft quorum)")]
    if args.hsdp:
        kinds += [("hsdp_replicas", "HSDP: 2 groups of 2 FSDP ranks")]
    if not args.skip_ray:
        kinds += [("ray_replicas", "replicas as Ray actors"),
                  ("ray_ddp", "Ray DDP, restart from checkpoint")]
    for kind, name in kinds:
        clean = run(base / kind, args.epochs, None, kind)
        killed = run(base / f"{kind}_killed", args.epochs, args.kill_at, kind)
        rows.append((name, step_seconds(clean),
                     progress_lost(base / f"{kind}_killed", killed, args.kill_at)))
    print(f"digits CNN, global batch 32 on 2 processes, {args.epochs} epochs, a checkpoint every "
          f"20 iterations, process 1 SIGKILLed at iteration {args.kill_at}")
    print(f"{'':34} {'ms / iteration':>15} {'progress lost per failure (s)':>31}")
    for name, step, lost in rows:
        print(f"{name:34} {step * 1e3:15.2f} {lost:31.2f}")
    if len(rows) > 1:
        _, ddp_step, ddp_lost = rows[-1]
        for name, step, lost in rows[:-1]:
            if name.startswith("HSDP"):  # 4 processes on the cores: its step is not comparable
                print(f"{name}: a failure costs {ddp_lost / lost:.1f}x less progress than the "
                      f"restart")
                continue
            print(f"{name}: quorum overhead {(step / ddp_step - 1) * 100:+.1f} % per step "
                  f"({(step - ddp_step) * 1e3:+.2f} ms); a failure costs "
                  f"{ddp_lost / lost:.1f}x less progress than the restart")

if __name__ == "__main__":
    main()
