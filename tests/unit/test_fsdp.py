"""``strategy=dict(type='fsdp')`` (FSDP2, ``fully_shard``) on 2 local gloo processes: it trains
what DDP trains; its checkpoints, sharded (each rank writes its shards through DCP) or full (one
file, full tensors under the model's own keys), resume exactly — also inside a gradient-
accumulation window, with clipping and with EMA — and a sharded one resumes in one process."""
import faulthandler
import json
import os
import socket
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.ranks import leave_rank_process
from distributed_runner.core.errors import ConfigError
from distributed_runner.model.sharding import parse_strategy
from hooks.ema_hook import EMAHook
from tests.toy import make_runner

ITERS = 6


def cfg(work_dir, strategy, optim=None, async_save=False, **extra):
    return dict(
        work_dir=str(work_dir), run_name=".", model=dict(type="TinyBlocks"), strategy=strategy,
        train_dataloader=dict(dataset=dict(type="ToyDataset", n=64), batch_size=4,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        train_cfg=dict(by_epoch=False, max_iters=ITERS, val_interval=3),
        optim_wrapper=optim or dict(optimizer=dict(type="AdamW", lr=0.01)),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=3, by_epoch=False,
                                           async_save=async_save),
                           logger=dict(type="LoggerHook", interval=2, sinks=["jsonl"])),
        randomness=dict(seed=0), log_level="WARNING", **extra)


FSDP = dict(type="fsdp", shard_modules=["Block"], checkpoint="full")
SHARDED = dict(type="fsdp", shard_modules=["Block"])  # checkpoint='sharded', the default
EMA = dict(type="EMAHook", momentum=0.3)
VAL = dict(val_dataloader=dict(dataset=dict(type="ToyDataset", n=16, seed=1), batch_size=4,
                               sampler=dict(type="DefaultSampler", shuffle=False)),
           val_evaluator=dict(type="Accuracy"), val_cfg=dict())
ACCUMULATE_CLIP = dict(optimizer=dict(type="AdamW", lr=0.01), accumulative_counts=2,
                       clip_grad=dict(max_norm=0.5))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    # a rank that fails exits at once (mp.spawn then ends the other, which would wait forever
    # in a collective); a hang ends after 240 s with every thread's stack printed
    faulthandler.dump_traceback_later(240, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        import tests.toy  # noqa: F401  (registers ToyDataset and TinyBlocks)
        from distributed_runner import Runner
        from distributed_runner.model.sharding import is_sharded

        facts = {}
        runs = {
            "ddp": cfg(f"{out}/ddp", "ddp"),
            "fsdp": cfg(f"{out}/fsdp", FSDP),
            "fsdp_resumed": cfg(f"{out}/fsdp_resumed", FSDP, resume=f"{out}/fsdp/iter_3.pth"),
            "ddp_acc": cfg(f"{out}/ddp_acc", "ddp", ACCUMULATE_CLIP),
            "fsdp_acc": cfg(f"{out}/fsdp_acc", FSDP, ACCUMULATE_CLIP),
            "fsdp_acc_resumed": cfg(f"{out}/fsdp_acc_resumed", FSDP, ACCUMULATE_CLIP,
                                    resume=f"{out}/fsdp_acc/iter_3.pth"),
            "ddp_ema": cfg(f"{out}/ddp_ema", "ddp", custom_hooks=[EMA], **VAL),
            "fsdp_ema": cfg(f"{out}/fsdp_ema", FSDP, custom_hooks=[EMA], **VAL),
            "fsdp_ema_resumed": cfg(f"{out}/fsdp_ema_resumed", FSDP, custom_hooks=[EMA], **VAL,
                                    resume=f"{out}/fsdp_ema/iter_3.pth"),
            "sharded_acc": cfg(f"{out}/sharded_acc", SHARDED, ACCUMULATE_CLIP,
                               custom_hooks=[EMA]),
            "sharded_acc_resumed": cfg(f"{out}/sharded_acc_resumed", SHARDED, ACCUMULATE_CLIP,
                                       custom_hooks=[EMA],
                                       resume=f"{out}/sharded_acc/iter_3.pth"),
            "sharded_async": cfg(f"{out}/sharded_async", SHARDED, ACCUMULATE_CLIP,
                                 async_save=True, custom_hooks=[EMA]),
            "sharded_async_resumed": cfg(f"{out}/sharded_async_resumed", SHARDED,
                                         ACCUMULATE_CLIP, async_save=True, custom_hooks=[EMA],
                                         resume=f"{out}/sharded_async/iter_3.pth"),
            "fsdp_acc_ema": cfg(f"{out}/fsdp_acc_ema", FSDP, ACCUMULATE_CLIP,
                                custom_hooks=[EMA]),
            "fsdp_bf16": cfg(f"{out}/fsdp_bf16", dict(
                FSDP, mixed_precision=dict(param_dtype="bfloat16", reduce_dtype="float32"))),
        }
        for name, config in runs.items():
            runner = Runner.from_cfg(config)
            sharded = [n for n, m in runner.model.named_modules() if is_sharded(m)]
            runner.train()
            local = {n: type(p).__name__ for n, p in runner.model.named_parameters()}
            facts[name] = {"sharded": sharded, "param_types": sorted(set(local.values())),
                           "val": runner.message_hub.get_scalar("val/accuracy").values()
                           if "val_dataloader" in config else []}
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(facts, f)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    leave_rank_process()


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return out, json.loads((out / "rank0.json").read_text())


@pytest.mark.timeout(300)
def test_fsdp_shards_the_named_blocks_and_the_root(two_rank_runs):
    _, facts = two_rank_runs
    assert facts["fsdp"]["sharded"] == ["", "blocks.0", "blocks.1"]
    assert facts["fsdp"]["param_types"] == ["DTensor"]
    assert facts["ddp"]["sharded"] == [] and facts["ddp"]["param_types"] == ["Parameter"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fsdp, ddp", [("fsdp", "ddp"), ("fsdp_acc", "ddp_acc"),
                                       ("fsdp_ema", "ddp_ema")])
def test_fsdp_trains_what_ddp_trains_and_saves_full_tensors(two_rank_runs, fsdp, ddp):
    out, _ = two_rank_runs
    a, b = weights(out / fsdp / f"iter_{ITERS}.pth"), weights(out / ddp / f"iter_{ITERS}.pth")
    assert a["state_dict"].keys() == b["state_dict"].keys()
    start = {k: v for k, v in make_runner(out / "init", model=dict(type="TinyBlocks"))
             .model.state_dict().items()}
    assert max((b["state_dict"][k] - start[k]).abs().max() for k in start) > 1e-3
    for k, v in a["state_dict"].items():
        assert type(v) is torch.Tensor and v.shape == b["state_dict"][k].shape, k
        torch.testing.assert_close(v, b["state_dict"][k], rtol=1e-5, atol=1e-6, msg=k)
    # the optimizer state is keyed by parameter name and full-sized, as DDP's values
    assert set(a["optimizer"]["state"]) == set(a["state_dict"])
    if "ema_state_dict" in b:  # the average of sharded weights, saved whole
        assert a["ema_state_dict"].keys() == b["ema_state_dict"].keys()
        for k, v in b["ema_state_dict"].items():
            assert type(a["ema_state_dict"][k]) is torch.Tensor, k
            torch.testing.assert_close(a["ema_state_dict"][k], v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("straight, resumed", [("fsdp", "fsdp_resumed"),
                                               ("fsdp_acc", "fsdp_acc_resumed"),
                                               ("fsdp_ema", "fsdp_ema_resumed")])
def test_fsdp_resume_is_exact(two_rank_runs, straight, resumed):
    out, _ = two_rank_runs
    a = weights(out / straight / f"iter_{ITERS}.pth")
    b = weights(out / resumed / f"iter_{ITERS}.pth")
    for part in ("state_dict", "ema_state_dict"):
        for k in a.get(part, {}):
            assert torch.equal(a[part][k], b[part][k]), f"{part} {k}"
    if straight == "fsdp_acc":  # iteration 3 is inside a window of 2: its gradients were kept
        assert "accumulated_grads" in weights(out / straight / "iter_3.pth")


@pytest.mark.timeout(300)
@pytest.mark.timeout(300)
def test_fsdp_validates_with_the_averaged_weights_as_ddp_does(two_rank_runs):
    _, facts = two_rank_runs
    assert len(facts["fsdp_ema"]["val"]) == 2
    assert facts["fsdp_ema"]["val"] == facts["ddp_ema"]["val"]


@pytest.mark.timeout(300)
def test_fsdp_mixed_precision_trains(two_rank_runs):
    out, _ = two_rank_runs
    ckpt = weights(out / "fsdp_bf16" / f"iter_{ITERS}.pth")
    assert all(v.dtype == torch.float32 for v in ckpt["state_dict"].values())
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())


@pytest.mark.timeout(300)
def test_an_fsdp_checkpoint_resumes_in_one_process(two_rank_runs, tmp_path):
    out, _ = two_rank_runs
    path = out / "fsdp" / "iter_3.pth"
    runner = make_runner(tmp_path, **{k: v for k, v in cfg(tmp_path, FSDP, resume=str(path))
                                      .items() if k != "work_dir"})
    runner._load_or_resume()
    saved = weights(path)["state_dict"]
    for k, v in runner.model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert runner.iter == 3


@pytest.mark.parametrize("spec, key, says", [
    (dict(type="fsdb"), "strategy.type", "did you mean 'fsdp'"),
    (dict(type="fsdp", shard_module=["Block"]), "strategy.shard_module",
     "did you mean 'shard_modules'"),
    (dict(type="fsdp", mixed_precision=dict(param_dtype="bf17")),
     "strategy.mixed_precision.param_dtype", "takes one of"),
    (dict(type="ddp", find_unused_parameters=True), "strategy.find_unused_parameters",
     "model_wrapper_cfg"),
    (42, "strategy", "takes 'ddp', 'fsdp'"),
])
def test_a_wrong_strategy_is_one_line_naming_the_key(spec, key, says):
    with pytest.raises(ConfigError) as err:
        parse_strategy(spec)
    assert err.value.key == key and says in str(err.value)


def test_a_shard_module_the_model_lacks_is_named_before_training(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path, **{k: v for k, v in cfg(tmp_path, dict(
            type="fsdp", shard_modules=["Blok"])).items() if k != "work_dir"})
    assert err.value.key == "strategy.shard_modules" and "did you mean 'Block'" in str(err.value)


def sharded_weights(path):
    from distributed_runner.checkpoint.sharded import full_weights
    return full_weights(path, weights(path))


@pytest.mark.timeout(300)
def test_sharded_checkpoints_are_a_manifest_and_every_ranks_shards(two_rank_runs):
    out, _ = two_rank_runs
    folder = out / "sharded_acc"
    manifest = weights(folder / "iter_3.pth")
    assert "state_dict" not in manifest and "optimizer" not in manifest
    entry = manifest["sharded"]
    assert entry["keys"] == ["model", "optimizer"]
    assert sorted(entry["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert sorted(p.name for p in folder.glob("*.dcp")) == sorted(
        weights(folder / f"{n}.pth")["sharded"]["dir"] for n in ("iter_3", "iter_6"))
    # the EMA average is gathered into the manifest (full tensors)
    assert all(type(v) is torch.Tensor for v in manifest["ema_state_dict"].values())


@pytest.mark.timeout(300)
def test_sharded_checkpoints_train_and_resume_as_full_ones(two_rank_runs):
    """Saving shards, in the foreground or the background, does not change training (the same
    weights as the full-file run, EMA and accumulation included), and resuming from a
    mid-window shard checkpoint is exact."""
    out, _ = two_rank_runs
    full = weights(out / "fsdp_acc_ema" / f"iter_{ITERS}.pth")
    assert full["meta"]["ema_in_state_dict"]  # MMEngine's layout: state_dict is the average...
    EMAHook._swap_ema_state_dict(full)  # ...the training weights, as the shards hold them
    runs = ("sharded_acc", "sharded_acc_resumed", "sharded_async", "sharded_async_resumed")
    for run in runs:
        final = out / run / f"iter_{ITERS}.pth"
        model, ema = sharded_weights(final), weights(final)["ema_state_dict"]
        assert model.keys() == full["state_dict"].keys()
        for k, v in full["state_dict"].items():
            assert torch.equal(model[k], v), f"{run} {k}"
        for k, v in full["ema_state_dict"].items():
            assert torch.equal(ema[k], v), f"{run} ema {k}"
    # written in the background, committed: the pointer names the last one
    assert weights(out / "sharded_async" / "iter_3.pth")["meta"]["async_save"] is True
    assert (out / "sharded_async" / "last_checkpoint").read_text() == f"iter_{ITERS}.pth"


@pytest.mark.timeout(300)
def test_a_sharded_checkpoint_of_2_ranks_resumes_in_one_process(two_rank_runs, tmp_path):
    out, _ = two_rank_runs
    path = out / "sharded_acc" / "iter_3.pth"
    runner = make_runner(tmp_path, **{k: v for k, v in cfg(
        tmp_path, SHARDED, ACCUMULATE_CLIP, resume=str(path)).items() if k != "work_dir"})
    runner._load_or_resume()
    saved = sharded_weights(path)
    assert runner.iter == 3
    for k, v in runner.model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(str(path.parent / weights(path)["sharded"]["dir"]), str(tmp_path / "f.pt"))
    adam = weights(tmp_path / "f.pt")["optimizer"]["state"]
    names = [n for n, _ in runner.model.named_parameters()]
    state = runner.optim_wrapper.optimizer.state
    for name, param in zip(names, runner.model.parameters()):
        assert torch.equal(state[param]["exp_avg"], adam[name]["exp_avg"]), name
    runner.train()  # on from iteration 3 to 6
    assert runner.iter == ITERS
    first = weights(tmp_path / "iter_6.pth")  # one process: not sharded, one full file
    assert "sharded" not in first and first["meta"]["world_size"] == 1
    assert first["meta"]["iter"] == ITERS and saved.keys() == first["state_dict"].keys()


@pytest.mark.timeout(300)
def test_a_torn_shard_is_refused_like_a_damaged_file(two_rank_runs, tmp_path):
    import shutil

    from distributed_runner.checkpoint.files import CheckpointDamaged, load_file
    source = out_dir = two_rank_runs[0] / "sharded_acc"
    copy = tmp_path / "copy"
    shutil.copytree(out_dir, copy)
    entry = weights(source / "iter_3.pth")["sharded"]
    shard = copy / entry["dir"] / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointDamaged) as err:
        load_file(copy / "iter_3.pth", "resume")
    assert "__1_0.distcp has" in str(err.value) and "when it was written" in str(err.value)
