"""Elastic worker groups (``launcher.num_workers=(min, max)``, distributed_runner/data/elastic.py):
the global batch and its sample order do not depend on the world size, so a run resized
2 -> 1 -> 2 (2 local gloo processes, then this process alone, then 2 again, each resuming the
other's checkpoint) ends within 1e-5 of the run that stayed at 2; one iteration is one optimizer
step at any size; the driver refuses a range that cannot split the global batch."""
import faulthandler
import os
import subprocess
import sys
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.ranks import leave_rank_process
from distributed_runner import Runner
from distributed_runner.cli import worker_count
from distributed_runner.core.errors import ConfigError
from distributed_runner.data.elastic import GlobalBatchPlan, GlobalBatchSampler
from distributed_runner.data.loaders import DefaultSampler
from distributed_runner.launch.launcher import normalize_launcher, validate_config
from tests.toy import ToyDataset, free_port

ELASTIC = dict(type="ray", num_workers=(1, 2))


def cfg(work_dir, launcher=ELASTIC, batch_size=4, **extra):
    """TinyBlocks (LayerNorm: no batch statistics), AdamW, a warm-up by iteration; 64 samples in
    global batches of 8: 8 iterations an epoch, 12 in all (the sampler reshuffles once)."""
    out = dict(
        work_dir=str(work_dir), run_name=".", model=dict(type="TinyBlocks"), launcher=launcher,
        train_dataloader=dict(dataset=dict(type="ToyDataset", n=64), batch_size=batch_size,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        train_cfg=dict(by_epoch=False, max_iters=12),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=dict(type="LinearLR", start_factor=0.5, by_epoch=False, end=6),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=4, by_epoch=False),
                           logger=dict(type="LoggerHook", interval=2, sinks=["jsonl"])),
        randomness=dict(seed=0), log_level="WARNING")
    out.update(extra)
    return out


def weights(runner):
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


def relative_gap(a, b):
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max()).item() for k in b)


# -- the split -----------------------------------------------------------------------------------
@pytest.mark.parametrize("global_batch,batch_size,world,micro,count", [
    (8, 4, 2, 4, 1), (8, 4, 1, 4, 2), (48, 16, 3, 16, 1), (48, 16, 2, 12, 2), (24, 5, 2, 4, 3)])
def test_each_rank_takes_an_even_share_in_micro_batches_no_larger_than_batch_size(
        global_batch, batch_size, world, micro, count):
    plan = GlobalBatchPlan.build(global_batch, batch_size, world, 0)
    assert (plan.micro_batch, plan.micro_batches) == (micro, count)
    assert plan.micro_batch * plan.micro_batches * world == global_batch


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_size_trains_the_same_global_batches_in_the_same_order(world):
    data = ToyDataset(n=50)
    steps = []
    for rank in range(world):
        sampler = GlobalBatchSampler(data, GlobalBatchPlan.build(16, 4, world, rank), seed=3)
        sampler.set_epoch(1)
        micro = list(sampler)
        per_step = sampler.plan.micro_batches
        full = [sum(micro[i:i + per_step], []) for i in range(0, 3 * per_step, per_step)]
        steps.append(full + [sum(micro[3 * per_step:], [])])  # the tail: what is left
    union = [sorted(sum((s[t] for s in steps), [])) for t in range(len(steps[0]))]
    g = torch.Generator().manual_seed(3 + 1)
    order = torch.randperm(50, generator=g).tolist()
    # 3 global batches of 16, then the 2 samples left (each once: nothing wraps around)
    assert union == [sorted(order[t * 16:(t + 1) * 16]) for t in range(4)]
    assert len(union[3]) == 2


def test_at_full_size_each_rank_gets_what_default_sampler_gives_it():
    data = ToyDataset(n=64)
    for rank in (0, 1):
        ours = GlobalBatchSampler(data, GlobalBatchPlan.build(8, 4, 2, rank), seed=5)
        theirs = DefaultSampler(data, seed=5, rank=rank, world_size=2)
        assert sum(list(ours), []) == list(theirs)


def test_resume_at_skips_whole_global_batches():
    data = ToyDataset(n=64)
    sampler = GlobalBatchSampler(data, GlobalBatchPlan.build(8, 4, 1, 0))
    full = list(sampler)
    sampler.resume_at(3)
    assert list(sampler) == full[3 * 2:] and list(sampler) == full  # once, then the whole epoch


# -- config --------------------------------------------------------------------------------------
def test_num_workers_takes_a_range_and_the_command_line_says_min_max():
    assert normalize_launcher(ELASTIC)["num_workers"] == (1, 2)
    assert normalize_launcher(dict(type="ray", num_workers=[2, 4]))["num_workers"] == (2, 4)
    assert normalize_launcher(dict(type="ray", num_workers=(2, 2)))["num_workers"] == 2
    for bad in ((2, 1), (0, 2), (1, 2, 3), "2-4"):
        with pytest.raises(ConfigError, match="launcher.num_workers"):
            normalize_launcher(dict(type="ray", num_workers=bad))
    assert worker_count("2-4") == (2, 4) and worker_count("3") == 3


def test_a_range_that_cannot_split_the_global_batch_is_refused_on_the_driver(tmp_path):
    bad = cfg(tmp_path, launcher=dict(type="ray", num_workers=(2, 4)), batch_size=16)
    with pytest.raises(ConfigError, match=r"global batch 64 .* over 3 workers: make it a "
                                          r"multiple of 12"):
        validate_config(bad)
    validate_config(cfg(tmp_path, launcher=dict(type="ray", num_workers=(2, 4)), batch_size=12))
    sampler = cfg(tmp_path)
    sampler["train_dataloader"]["sampler"] = dict(type="InfiniteSampler")
    with pytest.raises(ConfigError, match="train_dataloader.sampler"):
        validate_config(sampler)


def test_the_command_line_range_reaches_the_driver_check_and_a_bad_one_is_one_line(tmp_path):
    config = tmp_path / "cfg.py"
    config.write_text("import tests.toy\n" + "\n".join(
        f"{k} = {v!r}" for k, v in cfg(tmp_path / "wd", launcher="none").items()))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    drun = [sys.executable, "-m", "distributed_runner.cli", "train", str(config)]
    done = subprocess.run(drun + ["--num-workers", "two"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2 and "expected N or MIN-MAX (e.g. 2-4)" in done.stderr
    # global batch 4 x 4 = 16 cannot be split over 3: refused before Ray starts
    done = subprocess.run(drun + ["--num-workers", "2-4"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "drun: error: launcher.num_workers: the global batch 16 "), done.stderr
    assert "Ray" not in done.stdout  # no cluster was joined or started


# -- one process ---------------------------------------------------------------------------------
def test_one_worker_of_two_trains_as_one_process_with_the_double_batch(tmp_path):
    """Alone, an elastic (1, 2) run does two micro-batches of 4 per step: the same steps as a
    plain run with batch 8, the same iteration count and learning rates."""
    elastic = Runner.from_cfg(cfg(tmp_path / "elastic"))
    elastic.train()
    plain = Runner.from_cfg(cfg(tmp_path / "plain", launcher="none", batch_size=8))
    plain.train()
    assert elastic.elastic_plan.micro_batches == 2 and len(elastic.train_dataloader) == 8
    assert elastic.iter == plain.iter == 12
    assert elastic.optim_wrapper.get_lr() == plain.optim_wrapper.get_lr()
    a, b = weights(elastic), weights(plain)
    assert any(not torch.equal(a[k], b[k]) for k in a)  # summed in another order...
    assert relative_gap(a, b) < 1e-5  # ...to the same step


def test_accumulation_is_part_of_the_global_batch_and_done_inside_the_step(tmp_path):
    optim = dict(optimizer=dict(type="AdamW", lr=0.01), accumulative_counts=2)
    elastic = Runner.from_cfg(cfg(tmp_path / "elastic", batch_size=2, optim_wrapper=optim))
    elastic.train()
    plain = Runner.from_cfg(cfg(tmp_path / "plain", launcher="none", batch_size=8))
    plain.train()
    assert elastic.optim_wrapper.accumulative_counts == 1
    assert (elastic.elastic_plan.micro_batches, elastic.elastic_plan.micro_batch) == (4, 2)
    assert relative_gap(weights(elastic), weights(plain)) < 1e-5


# -- 2 -> 1 -> 2 ---------------------------------------------------------------------------------
def _two_ranks(rank: int, port: int, runs: list, errors: str) -> None:
    faulthandler.dump_traceback_later(180, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        import tests.toy  # noqa: F401  (registers ToyDataset and TinyBlocks)
        for run in runs:
            runner = Runner.from_cfg(run)
            runner.train()
            if rank == 0:
                torch.save(weights(runner), f"{run['work_dir']}/final.pt")
    except BaseException:
        with open(f"{errors}.rank{rank}", "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    leave_rank_process()


def on_two_ranks(tmp_path, *runs):
    try:
        mp.spawn(_two_ranks, args=(free_port(), list(runs), str(tmp_path / "error")), nprocs=2)
    except Exception:
        logs = [p.read_text() for p in tmp_path.glob("error.rank*")]
        pytest.fail("\n".join(logs) or "a rank failed without a traceback")


@pytest.mark.slow("three groups of gloo processes, resized")
def test_a_run_resized_2_1_2_ends_within_1e5_of_the_run_that_stayed_at_2(tmp_path):
    steady, shrunk, regrown = (tmp_path / n for n in ("steady", "shrunk", "regrown"))
    on_two_ranks(tmp_path, cfg(steady))  # 12 iterations on 2 ranks; checkpoints at 4, 8, 12
    alone = Runner.from_cfg(cfg(shrunk, resume=str(steady / "iter_4.pth")))  # 2 -> 1
    alone.train()
    on_two_ranks(tmp_path, cfg(regrown, resume=str(shrunk / "iter_8.pth")))  # 1 -> 2
    reference = torch.load(steady / "final.pt", weights_only=True)
    assert relative_gap(weights(alone), reference) < 1e-5
    assert relative_gap(torch.load(regrown / "final.pt", weights_only=True), reference) < 1e-5
    before = torch.load(steady / "iter_4.pth", weights_only=False)["state_dict"]
    assert relative_gap(before, reference) > 1e-2  # it did train after the resizes
    assert torch.load(shrunk / "iter_8.pth", weights_only=False)["meta"]["world_size"] == 1
