"""``tune=dict(...)``: every mistake is one line naming the key, before Ray starts (no Ray here)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from distributed_runner.cli import main
from distributed_runner.core.config import Config
from distributed_runner.core.errors import ConfigError
from distributed_runner.tune import algorithms
from distributed_runner.tune.driver import choose_concurrency
from distributed_runner.tune.spec import parse_tune

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "digits_tune.py"


def _cfg(**tune) -> Config:
    cfg = Config.fromfile(CONFIG)
    block = copy.deepcopy(dict(cfg["tune"]))
    block.update(tune)
    cfg["tune"] = block
    return cfg


def _error(**tune) -> str:
    with pytest.raises(ConfigError) as info:
        parse_tune(_cfg(**tune))
    text = str(info.value)
    assert "\n" not in text
    return text


LR = "optim_wrapper.optimizer.lr"


def test_the_docs_config_blocks_are_valid_sweeps():
    from tests.docs_blocks import docs_block
    from tests.unit.test_docs_config_snippets import alternatives

    groups = alternatives(docs_block("sweeps-config"))
    assert len(groups) == 2
    kinds = []
    for values in groups:
        cfg = Config.fromfile(ROOT / "configs" / "digits_cnn.py")
        cfg["tune"] = values["tune"]
        kinds.append(parse_tune(cfg).scheduler)
    assert kinds == ["ASHA", "PBT"]


def test_the_example_sweep_is_valid_and_fills_its_defaults():
    spec = parse_tune(_cfg())
    assert (spec.metric, spec.mode, spec.scheduler, spec.search_alg) == (
        "accuracy",
        "max",
        "ASHA",
        "random",
    )
    # ASHA runs on epochs up to the run's length, and does not stop the last trials at max_t
    assert spec.scheduler_options["time_attr"] == "epoch"
    assert spec.scheduler_options["max_t"] == 12
    assert spec.scheduler_options["stop_last_trials"] is False
    assert spec.space[LR]["base"] == 10


@pytest.mark.parametrize(
    "tune, expected",
    [
        ({"num_sample": 3}, "tune.num_sample: unknown key (did you mean 'num_samples'"),
        (
            {
                "param_space": {
                    "optim_wrapper.optimzer.lr": {"type": "uniform", "lower": 0, "upper": 1}
                }
            },
            "tune.param_space.optim_wrapper.optimzer.lr: optim_wrapper has no key 'optimzer' "
            "(did you mean 'optimizer'",
        ),
        (
            {"param_space": {"param_scheduler.5.end": {"type": "choice", "categories": [1]}}},
            "tune.param_space.param_scheduler.5.end: '5' is not an index of param_scheduler",
        ),
        (
            {"param_space": {LR: {"type": "loguniform", "lower": 0, "upper": 1}}},
            f"tune.param_space.{LR}.lower: a log scale needs lower > 0",
        ),
        (
            {"param_space": {LR: {"type": "uniform", "lower": 0.1, "upper": 0.01}}},
            f"tune.param_space.{LR}: lower (0.1) must be below upper (0.01)",
        ),
        (
            {"param_space": {LR: {"type": "uniform", "lowr": 0.1, "upper": 0.01}}},
            f"tune.param_space.{LR}.lowr: uniform has no option 'lowr' (did you mean 'lower'",
        ),
        (
            {"param_space": {LR: {"type": "logunifrom", "lower": 0.1, "upper": 1}}},
            f"tune.param_space.{LR}.type: unknown domain 'logunifrom' (did you mean 'loguniform'",
        ),
        (
            {"param_space": {"model.width": {"type": "choice", "categories": []}}},
            "tune.param_space.model.width.categories: takes a non-empty list",
        ),
        (
            {"metric": "acc"},
            "tune.metric: 'acc' is not a validation metric; the evaluator reports: accuracy",
        ),
        ({"mode": "maximum"}, "tune.mode: takes 'max' or 'min'"),
        (
            {"scheduler": {"type": "ASHB"}},
            "tune.scheduler.type: unknown 'ASHB' (did you mean 'ASHA'",
        ),
        (
            {"scheduler": {"type": "asha", "max_tt": 3}},
            "tune.scheduler.max_tt: AsyncHyperBandScheduler has no argument 'max_tt' "
            "(did you mean 'max_t'",
        ),
        (
            {"scheduler": {"type": "ASHA", "max_t": 50}},
            "tune.scheduler.max_t: 50 is beyond the run's 12 epochs",
        ),
        (
            {"scheduler": {"type": "ASHA", "metric": "loss"}},
            "tune.scheduler.metric: is set by the sweep: use tune.metric",
        ),
        (
            {"search_alg": {"type": "random", "random_sate": 1}},
            "tune.search_alg.random_sate: BasicVariantGenerator has no argument 'random_sate' "
            "(did you mean 'random_state'",
        ),
        (
            {"search_alg": {"type": "optuna", "seeed": 1}},
            "tune.search_alg.seeed: OptunaSearch has no argument 'seeed' (did you mean 'seed'",
        ),
        (
            {"search_alg": {"type": "grid"}},
            f"tune.param_space.{LR}: search_alg 'grid' takes grid_search or choice",
        ),
        (
            {
                "search_alg": "hyperopt",
                "param_space": {"model.width": {"type": "grid_search", "values": [8, 16]}},
            },
            "tune.param_space.model.width: hyperopt does not walk grids",
        ),
        (
            {
                "scheduler": {
                    "type": "PBT",
                    "perturbation_interval": 1,
                    "hyperparam_mutations": {"train_dataloader.batch_size": [16, 32]},
                }
            },
            "tune.scheduler.hyperparam_mutations.train_dataloader.batch_size: cannot change mid-run",
        ),
        (
            {"scheduler": {"type": "PBT", "perturbation_interval": 1}},
            "tune.scheduler.hyperparam_mutations: PBT needs hyperparam_mutations",
        ),
        (
            {
                "scheduler": {
                    "type": "PB2",
                    "perturbation_interval": 1,
                    "hyperparam_bounds": {LR: [1, 0.1]},
                }
            },
            f"tune.scheduler.hyperparam_bounds.{LR}: takes [lower, upper] with lower < upper",
        ),
        ({"trial_launcher": "rey"}, "tune.trial_launcher: unknown 'rey' (did you mean 'ray'"),
        ({"trial_launcher": "ray"}, "tune.trial_launcher: 'ray' runs each trial with the config's"),
        ({"resources_per_trial": {"CPU": -1}}, "tune.resources_per_trial.CPU: takes a number >= 0"),
        ({"stop_grace_s": 0}, "tune.stop_grace_s: takes seconds (> 0)"),
    ],
)
def test_each_mistake_is_one_line_naming_the_key(tune, expected):
    assert _error(**tune).startswith(expected)


def test_pbt_with_a_perturbation_between_validations_is_refused():
    cfg = _cfg(
        scheduler={
            "type": "PBT",
            "perturbation_interval": 3,
            "hyperparam_mutations": {LR: [1e-3, 2e-3]},
        }
    )
    cfg["train_cfg"]["val_interval"] = 2
    with pytest.raises(ConfigError, match="not a multiple of train_cfg.val_interval"):
        parse_tune(cfg)


def test_a_missing_optional_searcher_package_is_one_line_with_the_install(monkeypatch):
    # as if optuna were not installed: the package name looked up is one that does not exist
    monkeypatch.setitem(algorithms.EXTRAS, "optuna", "optuna_is_not_installed")
    monkeypatch.setitem(algorithms.INSTALL, "optuna_is_not_installed", "optuna>=5")
    text = _error(search_alg={"type": "optuna"})
    assert text.startswith(
        "tune.search_alg.type: 'optuna' needs optuna_is_not_installed: pip install 'optuna>=5'"
    )


def test_more_concurrent_trials_than_the_cluster_fits_is_refused():
    cfg = _cfg(max_concurrent_trials=3)
    spec = parse_tune(cfg)
    with pytest.raises(ConfigError) as info:
        choose_concurrency(spec, cfg, {"CPU": 2.0})
    assert str(info.value).startswith(
        "tune.max_concurrent_trials: 3 trials x (1 CPU) do not fit in the cluster's 2 CPU: at most 2"
    )
    assert choose_concurrency(parse_tune(_cfg()), cfg, {"CPU": 2.0}) == 2
    with pytest.raises(ConfigError, match="a trial needs 1 GPU, the cluster has 0 GPU"):
        choose_concurrency(parse_tune(_cfg(resources_per_trial={"GPU": 1})), cfg, {"CPU": 2.0})


def test_ray_train_trials_count_their_workers_and_name_the_launcher_key():
    cfg = _cfg(trial_launcher="ray")
    cfg["launcher"] = dict(type="ray", num_workers=2)
    cluster = {"CPU": 2.0, "memory": 8.0 * (1 << 30)}
    # a 2-worker trial fits a 2-CPU machine, as drun train --launcher ray does
    assert choose_concurrency(parse_tune(cfg), cfg, cluster) == 1
    cfg["launcher"]["num_workers"] = 3
    with pytest.raises(ConfigError) as info:
        choose_concurrency(parse_tune(cfg), cfg, cluster)
    assert str(info.value) == (
        "launcher.num_workers: a Ray Train trial holds 3 CPU (its workers), the cluster has 2 CPU:"
        " fewer workers (--num-workers) or more nodes"
    )


def test_the_command_line_prints_one_line_and_exits_2(capsys):
    code = main(
        [
            "tune",
            str(CONFIG),
            "--dry-run",
            "--scheduler",
            "median",
            "--cfg-options",
            "tune.scheduler.grace_perod=1",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "drun: error: tune.scheduler.grace_perod: MedianStoppingRule has no argument"
    )
    assert "\n" not in err
    # a mutation PBT cannot apply, as a flag override of the scheduler
    code = main(
        [
            "tune",
            str(CONFIG),
            "--dry-run",
            "--scheduler",
            "PBT",
            "--cfg-options",
            "tune.scheduler.perturbation_interval=1",
            "tune.scheduler.hyperparam_mutations={'model.width': [8, 16]}",
        ]
    )
    assert code == 2
    assert "model.width: cannot change mid-run" in capsys.readouterr().err


def test_dry_run_shows_trials_without_starting_ray(capsys, monkeypatch):
    import ray
    from ray import tune

    def refused(*args, **kwargs):
        raise AssertionError("a dry run started Ray")

    # the session's Ray cluster may already be up (integration tests): refuse any start instead
    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setattr(tune.Tuner, "fit", refused)
    assert main(["tune", str(CONFIG), "--dry-run", "--num-samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 sample(s), search random, scheduler ASHA" in out
    assert "trial 0: optim_wrapper.optimizer.lr=" in out
