"""One local Ray cluster for the whole test session (4 logical CPUs: 2 training workers plus room
for Ray Data), started lazily by the first test that needs it and stopped at the end."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    # workers inherit this environment: they must import the project and the test probes
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
