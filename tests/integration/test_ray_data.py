"""The digits example reading Parquet through Ray Data on 2 Ray Train workers: the docs' two
commands (docs/how-to/ray-data.md, ``docs-test: ray-data``), cut down."""
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_runner import Config
from distributed_runner.launch.launcher import RayLauncher, normalize_launcher
from tests.docs_blocks import docs_commands

pytestmark = [pytest.mark.integration, pytest.mark.slow("the digits example through Ray Data on 2 Ray workers"),
              pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def test_digits_parquet_with_ray_data_on_two_workers(ray_cluster, tmp_path):
    make, train = (shlex.split(c) for c in docs_commands("ray-data"))
    assert make == ["python", "tools/digits_to_parquet.py"]
    assert train == ["drun", "train", "configs/digits_cnn_raydata.py"]
    data = tmp_path / "digits_parquet"
    out = subprocess.run([sys.executable, str(ROOT / make[1]), str(data)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (data / "train").iterdir()) == ["part-0.parquet",
                                                                  "part-1.parquet"]
    cfg = Config.fromfile(ROOT / train[2], cfg_options=[
        f"work_dir={tmp_path / 'wd'}", f"train_dataloader.dataset.paths={data / 'train'}",
        "train_cfg.max_epochs=2", "param_scheduler=None", "log_level=WARNING"])
    launcher = RayLauncher(cfg, normalize_launcher(cfg["launcher"]))
    metrics = launcher.fit().metrics
    # 1438 rows over 2 workers, batch 16: 45 iterations an epoch on each worker
    assert metrics["iter"] == 2 * 45
    assert metrics["val/accuracy"] >= 90.0
