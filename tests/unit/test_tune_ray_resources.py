"""How many Ray Train sweep trials fit at once, from the per-trial footprint (no Ray started)."""
import pytest

from distributed_runner.core.errors import ConfigError
from distributed_runner.tune.ray_trial import next_generation
from distributed_runner.tune.ray_trial_resources import (
    ray_trial_footprint,
    ray_trial_resources,
    ray_trials_that_fit,
)


def cfg(**launcher):
    return dict(launcher=dict(type="ray", **launcher),
                train_dataloader=dict(dataset=dict(type="DigitsDataset"), batch_size=8))


MEMORY = 8.0 * (1 << 30)  # a node's logical memory (ray.cluster_resources()['memory'])
ACTOR = 16.0 * (1 << 20)  # the trial actor's bundle: no CPU, a little memory


def has(**resources):
    """A cluster's resources, its memory included."""
    return {"memory": MEMORY, **{k: float(v) for k, v in resources.items()}}


def test_the_trial_actor_takes_no_cpu_and_the_workers_count_in_the_footprint():
    assert ray_trial_resources(cfg(num_workers=2)) == {"CPU": 0.0, "memory": ACTOR}
    assert ray_trial_footprint(cfg(num_workers=2)) == {"CPU": 2.0, "memory": ACTOR}
    # the measured deadlock: on 2 CPUs two 1-worker trials started and no worker got a CPU
    assert ray_trials_that_fit(cfg(num_workers=1), has(CPU=2)) == 2
    assert ray_trials_that_fit(cfg(num_workers=2), has(CPU=2)) == 1  # as drun train does
    assert ray_trials_that_fit(cfg(num_workers=2), has(CPU=4)) == 2
    assert ray_trials_that_fit(cfg(num_workers=2), has(CPU=1)) == 0
    assert ray_trials_that_fit(cfg(num_workers=1, resources_per_worker={"CPU": 0.25}),
                               has(CPU=1)) == 4  # 4 x 0.25 fits exactly, despite rounding
    assert ray_trials_that_fit(cfg(num_workers=1), {"CPU": 4.0, "memory": ACTOR}) == 1


def test_gpus_custom_resources_elastic_groups_and_ray_data():
    gpu = cfg(num_workers=2, use_gpu=True)
    assert ray_trial_footprint(gpu) == {"CPU": 2.0, "GPU": 2.0, "memory": ACTOR}
    assert ray_trials_that_fit(gpu, has(CPU=16, GPU=4)) == 2
    assert ray_trials_that_fit(gpu, has(CPU=16)) == 0  # no GPU at all
    custom = cfg(num_workers=2, resources_per_worker={"CPU": 2, "accel": 1})
    assert ray_trials_that_fit(custom, has(CPU=64, accel=5)) == 2
    # an elastic group grows into whatever is free: its largest size counts
    assert ray_trial_footprint(cfg(num_workers=(1, 3)))["CPU"] == 3.0
    data = cfg(num_workers=1)
    data["train_dataloader"] = dict(type="RayDataLoader", dataset="digits")
    assert ray_trial_footprint(data)["CPU"] == 2.0  # one spare CPU for Ray Data
    assert ray_trials_that_fit(data, has(CPU=4)) == 2


def test_a_trial_without_the_ray_launcher_or_with_a_typo_is_one_line():
    with pytest.raises(ConfigError, match=r"^launcher: .*\(trial_launcher='ray'\) needs launcher="):
        ray_trials_that_fit(dict(launcher=None), has(CPU=4))
    with pytest.raises(ConfigError, match=r"launcher.num_worker.*did you mean 'num_workers'"):
        ray_trial_resources(cfg(num_worker=2))


def test_each_start_of_a_trial_is_a_new_train_run(tmp_path):
    assert next_generation(str(tmp_path / "absent"), "t_1") == 1
    for name in ("t_1-g1", "t_1-g3", "t_10-g7", "t_1-gx"):
        (tmp_path / name).mkdir()
    assert next_generation(str(tmp_path), "t_1") == 4
    assert next_generation(str(tmp_path), "t_10") == 8
    assert next_generation("s3://bucket/storage", "t_1") == 1
