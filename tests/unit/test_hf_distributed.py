"""A Hugging Face GPT-2 taken as it is, on 2 local gloo processes: DDP trains what one process
trains with the global batch, and FSDP2 (``shard_modules=['GPT2Block']``, tied embeddings and
all) trains what DDP trains and resumes exactly, from a full or a sharded checkpoint."""
from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("transformers")

from tests.hf_toy import GPT2, gpt2_cfg
from tests.toy import assert_state_equal, free_port, gloo_rank

ITERS = 6
# no dropout: the ranks draw their own masks, one process draws others
MODEL = dict(GPT2, config=dict(GPT2["config"], resid_pdrop=0.0, embd_pdrop=0.0))
FULL = dict(type="fsdp", shard_modules=["GPT2Block"], checkpoint="full")
SHARDED = dict(type="fsdp", shard_modules=["GPT2Block"])


def cfg(work_dir, batch_size: int, strategy=None, **extra) -> dict:
    """6 iterations, a checkpoint every 3 (``iter_3``, ``iter_6``). SGD, not Adam: the key bias
    of attention gets a gradient of pure rounding noise (softmax ignores it), which Adam would
    scale up to full steps that differ with the summation order of 1 vs 2 processes."""
    return gpt2_cfg(
        work_dir, model=MODEL, train_cfg=dict(by_epoch=False, max_iters=ITERS),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        train_dataloader=dict(dataset=dict(type="HFToyTokens", n=32), batch_size=batch_size,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=3, by_epoch=False),
                           logger=dict(type="LoggerHook", interval=3, sinks=["jsonl"])),
        **({"strategy": strategy} if strategy else {}), **extra)


def _full_state(model) -> dict:
    """The model's full, unsharded weights on the CPU (every rank takes part)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def _worker(rank: int, port: int, out: str) -> None:
    with gloo_rank(rank, port):
        import tests.hf_toy  # noqa: F401  (registers the datasets in this process)
        from distributed_runner import Runner
        from distributed_runner.model.sharding import is_sharded

        runs = {"ddp": cfg(f"{out}/ddp", 2, "ddp"),
                "fsdp": cfg(f"{out}/fsdp", 2, FULL),
                "fsdp_resumed": cfg(f"{out}/fsdp_resumed", 2, FULL,
                                    resume=f"{out}/fsdp/iter_3.pth"),
                "sharded": cfg(f"{out}/sharded", 2, SHARDED),
                "sharded_resumed": cfg(f"{out}/sharded_resumed", 2, SHARDED,
                                       resume=f"{out}/sharded/iter_3.pth")}
        facts = {}
        for name, config in runs.items():
            runner = Runner.from_cfg(config)
            facts[name] = [n for n, m in runner.model.named_modules() if is_sharded(m)]
            runner.train()
            state = _full_state(runner.model)
            if rank == 0:
                torch.save(state, f"{out}/{name}.pt")
        if rank == 0:
            with open(f"{out}/facts.json", "w") as f:
                json.dump(facts, f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_dist")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=2, join=True)
    return out


def _load(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.timeout(300)
def test_ddp_on_two_processes_trains_what_one_process_trains_with_the_global_batch(runs,
                                                                                  tmp_path):
    from distributed_runner import Runner

    one = Runner.from_cfg(cfg(tmp_path, 4))
    start = {k: v.clone() for k, v in one.model.state_dict().items()}
    one.train()
    ddp = _load(runs / "ddp.pt")
    assert ddp.keys() == start.keys()
    assert max((ddp[k] - start[k]).abs().max() for k in start) > 1e-3  # it trained
    for k, v in one.model.state_dict().items():
        torch.testing.assert_close(ddp[k], v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.timeout(300)
def test_fsdp_shards_the_gpt2_blocks_trains_what_ddp_trains_and_resumes_exactly(runs):
    facts = json.loads((runs / "facts.json").read_text())
    assert facts["fsdp"] == ["", "transformer.h.0", "transformer.h.1"]
    ddp = _load(runs / "ddp.pt")
    for name in ("fsdp", "sharded"):
        trained = _load(runs / f"{name}.pt")
        for k, v in ddp.items():
            torch.testing.assert_close(trained[k], v, rtol=1e-5, atol=1e-6, msg=f"{name} {k}")
        assert_state_equal(trained, _load(runs / f"{name}_resumed.pt"))
    assert "state_dict" in _load(runs / "fsdp" / "iter_3.pth")
