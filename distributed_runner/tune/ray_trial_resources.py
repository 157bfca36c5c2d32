"""What a Ray Train trial (``trial_launcher='ray'``) takes from the cluster, and so how many such
trials fit at once.

Tune schedules only the trial's own actor; the actor then starts a ``TorchTrainer`` whose worker
group reserves a placement group of its own, which Tune never sees. Tune would therefore start
as many trials as it has room for *actors* and leave their workers waiting for CPUs that the other
trials' actors hold: measured on 2 CPUs, two 1-worker trials (1-CPU actors) started together and
no worker ever got a CPU. So the actor asks for no CPU (:func:`ray_trial_resources`) and
the sweep limits how many trials run at once from the whole footprint
(:func:`ray_trials_that_fit`): workers x ``resources_per_worker`` plus the actor's bundle, plus
one spare CPU per trial when the config reads its data through Ray Data (as the launcher's own
resource check keeps one).

No Ray here: both functions work on the config and a resource dict
(``ray.cluster_resources()``), so the sweep can refuse a bad ``max_concurrent_trials`` in one
line before it starts anything.
"""

from __future__ import annotations

import math

from distributed_runner.core.errors import ConfigError
from distributed_runner.launch.launcher_config import (
    normalize_launcher,
    uses_ray_data,
    worker_resources,
)

# The trial actor's bundle: it only waits on its run's reports and stop requests. Tune refuses an
# empty bundle ({'CPU': 0}); a little logical memory makes it non-empty without taking CPU, so a
# trial of N one-CPU workers fits on N CPUs, as ``drun train --launcher ray`` does (with a sliver
# of a CPU, 2 workers on a 2-CPU machine were refused)
TRIAL_ACTOR_BUNDLE: dict[str, float] = {"CPU": 0.0, "memory": float(16 << 20)}
RAY_DATA_SPARE_CPU = 1.0  # what RayLauncher.check_resources keeps free for Ray Data


def ray_launcher_opts(cfg: dict) -> dict:
    """The normalized ``launcher`` of a Ray Train trial's config; a one-line error when it does
    not name the Ray launcher."""
    opts = normalize_launcher(cfg.get("launcher"))
    if opts is None:
        raise ConfigError(
            "launcher",
            "a Ray Train trial (trial_launcher='ray') needs launcher=dict(type='ray', "
            "num_workers=N, ...)",
        )
    return opts


def ray_trial_resources(cfg: dict) -> dict[str, float]:
    """The trial actor's own bundle: no CPU, 16 MiB of logical memory (the workers' placement
    group is the TorchTrainer's own, outside Tune's accounting)."""
    ray_launcher_opts(cfg)  # the config must run on Ray Train
    return dict(TRIAL_ACTOR_BUNDLE)


def ray_trial_footprint(cfg: dict) -> dict[str, float]:
    """Everything one Ray Train trial holds while it runs, by resource: its workers (an elastic
    group at its largest size, since it grows into whatever is free), the actor's bundle and, with
    Ray Data, one spare CPU."""
    opts = ray_launcher_opts(cfg)
    workers = opts["num_workers"]
    n = workers[1] if isinstance(workers, tuple) else workers
    need = {r: each * n for r, each in worker_resources(opts).items()}
    for r, each in ray_trial_resources(cfg).items():
        need[r] = need.get(r, 0.0) + each
    if uses_ray_data(cfg):
        need["CPU"] = need.get("CPU", 0.0) + RAY_DATA_SPARE_CPU
    return {r: float(v) for r, v in need.items() if v > 0}


def ray_trials_that_fit(cfg: dict, cluster_resources: dict[str, float]) -> int:
    """How many Ray Train trials of ``cfg`` the cluster holds at once (0 when not even one).

    ``cluster_resources`` is the cluster's total (``ray.cluster_resources()``); the answer is the
    smallest, over the resources a trial needs, of how many footprints fit in the total.
    """
    fits = []
    for resource, need in ray_trial_footprint(cfg).items():
        have = float(cluster_resources.get(resource, 0.0))
        # a hair of tolerance: 4 x 0.25 CPU must not lose a trial to floating point
        fits.append(math.floor(have / need + 1e-9))
    return max(0, min(fits)) if fits else 0
