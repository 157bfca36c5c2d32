"""env_cfg.num_threads sets torch's threads before anything is built (a sweep pins its trials'
count there, so best_config.py repeats its trial); MMEngine's other keys are accepted, any
other key is one line naming it."""
from types import SimpleNamespace

import pytest
import torch

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.tune.driver import pin_trial_threads, trial_threads
from tests.toy import base_cfg


def test_num_threads_is_applied_and_logged(tmp_path):
    before = torch.get_num_threads()
    try:
        runner = Runner.from_cfg(base_cfg(tmp_path, log_level="INFO", env_cfg=dict(num_threads=1,
                                                                 cudnn_benchmark=False)))
        assert torch.get_num_threads() == runner.num_threads == 1
        assert "device cpu (1 threads)" in (tmp_path / "logs" / "run.log").read_text()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("env_cfg,message", [
    (dict(num_thread=2), "env_cfg.num_thread: unknown key: env_cfg takes num_threads"),
    (dict(num_threads=0), "env_cfg.num_threads: 0 is not a whole number >= 1"),
    (dict(num_threads="4"), "env_cfg.num_threads: '4' is not a whole number >= 1"),
    ([1], "env_cfg: expected a dict such as dict(num_threads=4), got [1]"),
])
def test_a_wrong_env_cfg_is_one_line_naming_the_key(tmp_path, env_cfg, message):
    with pytest.raises(ConfigError) as e:
        Runner.from_cfg(base_cfg(tmp_path, env_cfg=env_cfg))
    assert str(e.value) == message or str(e.value).startswith(message)


def test_a_sweep_pins_its_trials_threads_unless_the_config_does(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg: dict = {}
    spec = SimpleNamespace(trial_launcher="none", resources_per_trial={"CPU": 2})
    assert trial_threads(spec, cfg) == 2  # the CPUs Ray gives the trial (its OMP_NUM_THREADS)
    pin_trial_threads(spec, cfg)
    assert cfg["env_cfg"] == {"num_threads": 2}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # passed on to the trials by Ray
    assert trial_threads(spec, cfg) == 3
    ray = SimpleNamespace(trial_launcher="ray", resources_per_trial=None)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert trial_threads(ray, {"launcher": dict(type="ray", num_workers=2)}) == 1  # 1 CPU each
    mine = {**cfg, "env_cfg": {"num_threads": 4}}
    pin_trial_threads(spec, mine)
    assert mine["env_cfg"] == {"num_threads": 4}
