"""The Ray launcher's driver-side checks, without starting Ray."""
import argparse

import pytest

from distributed_runner.cli import apply_launcher_flags, build_parser
from distributed_runner.core.errors import ConfigError
from distributed_runner.launch.launcher import RayLauncher, normalize_launcher, validate_config
from tests.toy import base_cfg


def test_defaults_and_single_process_forms():
    assert normalize_launcher(None) is None and normalize_launcher("none") is None
    assert normalize_launcher(dict(type="none")) is None
    opts = normalize_launcher("ray")
    assert opts["num_workers"] == 1 and opts["max_failures"] == 0 and opts["use_gpu"] is False


@pytest.mark.parametrize("spec,prefix,fragment", [
    (dict(type="ray", num_worker=2), "launcher.num_worker", "did you mean 'num_workers'"),
    (dict(type="slurm"), "launcher.type", "unknown launcher"),
    (dict(type="ray", num_workers=0), "launcher.num_workers", ">= 1"),
    (dict(type="ray", placement_strategy="TIGHT"), "launcher.placement_strategy", "one of"),
    (dict(type="ray", resources_per_worker=2), "launcher.resources_per_worker", "dict like"),
    ("k8s", "launcher", "expected 'none', 'ray'"),
])
def test_bad_launcher_options_are_one_line(spec, prefix, fragment):
    with pytest.raises(ConfigError) as err:
        normalize_launcher(spec)
    assert str(err.value).startswith(prefix + ":") and fragment in str(err.value)


def launcher_for(tmp_path, **opts):
    cfg = base_cfg(tmp_path)
    return RayLauncher(cfg, normalize_launcher(dict(type="ray", **opts)))


@pytest.mark.parametrize("opts,total,key,fragment", [
    (dict(num_workers=2, use_gpu=True), {"CPU": 8}, "launcher.use_gpu", "the cluster has 0"),
    (dict(num_workers=3), {"CPU": 2}, "launcher.num_workers", "need 3 CPU"),
    (dict(num_workers=2, resources_per_worker={"CPU": 2}), {"CPU": 3}, "launcher.num_workers",
     "need 4 CPU"),
])
def test_impossible_requests(tmp_path, opts, total, key, fragment):
    with pytest.raises(ConfigError) as err:
        launcher_for(tmp_path, **opts).check_resources(total)
    assert str(err.value).startswith(key + ":") and fragment in str(err.value)


def test_possible_requests_pass(tmp_path):
    launcher_for(tmp_path, num_workers=2).check_resources({"CPU": 2})
    launcher_for(tmp_path, num_workers=2, use_gpu=True).check_resources({"CPU": 4, "GPU": 2})


def test_ray_data_needs_spare_cpus(tmp_path):
    cfg = base_cfg(tmp_path, train_dataloader=dict(type="RayDataLoader", batch_size=4,
                                                   dataset=dict(type="parquet", paths="x")))
    launcher = RayLauncher(cfg, normalize_launcher(dict(type="ray", num_workers=2)))
    with pytest.raises(ConfigError, match="Ray Data would starve"):
        launcher.check_resources({"CPU": 2})
    launcher.check_resources({"CPU": 4})


def test_defaults_for_storage_and_name(tmp_path):
    launcher = launcher_for(tmp_path / "my_run")
    assert launcher.name == "my_run"
    assert launcher.storage_path == str(tmp_path / "my_run" / "ray_storage")
    s3 = RayLauncher(base_cfg(tmp_path), normalize_launcher(dict(type="ray",
                                                                 storage_path="s3://b/p")))
    assert s3.storage_path == "s3://b/p"


@pytest.mark.parametrize("overrides,prefix", [
    (dict(model=dict(type="ToyModle")), "model.type"),
    (dict(model=dict(type="ToyModel", hiden=2)), "model.hiden"),
    (dict(train_dataloader=dict(dataset=dict(type="ToyDataset", m=3), batch_size=2)),
     "train_dataloader.dataset.m"),
    (dict(optim_wrapper=dict(optimizer=dict(type="SGD", lrr=0.1))), "optim_wrapper.optimizer.lrr"),
    (dict(custom_hooks=[dict(type="SyncBuffersHook", priority="SOON")]),
     "custom_hooks[0].priority"),
    (dict(val_evaluator=dict(type="Acc")), "val_evaluator.type"),
])
def test_driver_validates_without_building(tmp_path, overrides, prefix):
    with pytest.raises(ConfigError) as err:
        validate_config(base_cfg(tmp_path, **overrides))
    assert str(err.value).startswith(prefix)


def test_cli_flags_override_the_config_launcher():
    args = build_parser().parse_args(["train", "c.py", "--launcher", "ray", "--num-workers", "4",
                                      "--gpu", "--address", "auto",
                                      "--max-failures", "2", "--storage-path", "/s"])
    cfg = {"launcher": dict(type="ray", num_workers=2, placement_strategy="SPREAD")}
    apply_launcher_flags(cfg, args)
    assert cfg["launcher"] == dict(type="ray", num_workers=4, placement_strategy="SPREAD",
                                   use_gpu=True, address="auto", max_failures=2,
                                   storage_path="/s")
    none = build_parser().parse_args(["train", "c.py", "--launcher", "none"])
    apply_launcher_flags(cfg, none)
    assert cfg["launcher"] == "none"
    plain = build_parser().parse_args(["train", "c.py"])
    cfg = {}
    apply_launcher_flags(cfg, plain)
    assert cfg == {}
    assert isinstance(plain, argparse.Namespace)


def test_a_trainer_without_ray_datasets_leaves_out_the_dataset_actor():
    """Ray Train's DatasetsCallback starts a DatasetManager actor at every worker group start;
    drun keeps it only where there are Ray Datasets to serve (core/ray_private.py)."""
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks import DatasetsCallback

    from distributed_runner.core.ray_private import no_dataset_actor_without_datasets

    def names(trainer):
        return [type(cb).__name__ for cb in trainer._create_default_callbacks()]

    scaling = ray.train.ScalingConfig(num_workers=2)
    plain = TorchTrainer(lambda config: None, scaling_config=scaling)
    assert "DatasetsCallback" in names(plain)  # what Ray does on its own
    assert no_dataset_actor_without_datasets(plain)
    assert "DatasetsCallback" not in names(plain) and "BackendSetupCallback" in names(plain)
    fed = TorchTrainer(lambda config: None, scaling_config=scaling,
                       datasets={"train": lambda: None})  # a dataset factory, built by Ray
    assert not no_dataset_actor_without_datasets(fed)
    assert any(isinstance(cb, DatasetsCallback) for cb in fed._create_default_callbacks())
