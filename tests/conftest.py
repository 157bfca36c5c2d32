import logging
import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")

import torch

torch.set_num_threads(1)

import tests.toy  # noqa: E402,F401  (registers the toy components)
from tests.suite_budget import (  # noqa: E402,F401  (the suite's time budget, a plugin)
    pytest_addoption,
    pytest_configure,
    pytest_runtest_protocol,
)


@pytest.fixture
def runlog(caplog):
    """caplog for the project logger (which does not propagate to the root logger)."""
    logger = logging.getLogger("distributed_runner")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="distributed_runner")
    yield caplog
    logger.removeHandler(caplog.handler)
