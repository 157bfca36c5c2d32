"""A mistake only a Ray worker can see reaches the terminal as drun's one line: ``drun train``
as a user runs it (a subprocess joining the session's Ray cluster) on 2 workers, with a model
that checks its argument against the world size, which only the workers know (the driver builds
the model on the meta device without a process group). Exit 2, one ``drun: error:`` line, no
traceback on the terminal, every failing rank's stack in the run's log. The driver's side of
other errors, without Ray workers: tests/unit/test_ray_worker_errors.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as torch_dist

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import MODELS
from distributed_runner.examples.digits import DigitsCNN

pytestmark = [pytest.mark.integration, pytest.mark.slow("a drun subprocess whose Ray workers fail"),
              pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


@MODELS.register_module(force=True)
class ShardedDigits(DigitsCNN):
    """DigitsCNN whose (pretend) head is split into ``shards`` parts, one set per rank group:
    ``shards`` must divide the world size, known once the process group exists."""

    def __init__(self, shards: int = 1, width: int = 16) -> None:
        if torch_dist.is_initialized() and torch_dist.get_world_size() % shards:
            raise ConfigError("model.shards", f"{shards} shards do not divide the "
                                              f"{torch_dist.get_world_size()} ranks")
        super().__init__(width=width)


def test_a_config_error_raised_on_the_workers_is_one_line_and_exit_2(ray_cluster, tmp_path):
    import ray

    config = tmp_path / "sharded.py"
    config.write_text(
        f"_base_ = {str(ROOT / 'configs' / 'digits_cnn.py')!r}\n"
        "custom_imports = dict(imports=['distributed_runner.examples.digits', "
        "'tests.integration.test_ray_driver_errors'])\n"
        "model = dict(type='ShardedDigits', shards=3)\n"
        "train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)\n")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", "train", str(config), "--launcher",
         "ray", "--num-workers", "2", "--address", ray.get_runtime_context().gcs_address,
         "--work-dir", str(tmp_path / "wd")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    errors = [line for line in text.splitlines() if "drun: error:" in line]
    assert errors == ["drun: error: model.shards: 3 shards do not divide the 2 ranks"], text
    # no traceback from the workers (Ray's "Error in training function"), the controller's
    # failure report or the driver
    assert "Traceback" not in text and "Error in training function" not in text, text[-3000:]
    (run,) = (tmp_path / "wd").glob("2*")
    log = (run / "logs" / "run.log").read_text()
    for rank in ("", "[rank 1] "):  # rank 0 through the Runner's log, rank 1 appended to it
        assert f"ERROR {rank}training failed on this worker: model.shards: 3 shards" in log, log
    assert log.count("Traceback (most recent call last):") == 2
    assert log.count("ConfigError: model.shards: 3 shards do not divide the 2 ranks") == 2
    assert "in __init__\n    raise ConfigError(" in log  # the stack down to the model's raise
