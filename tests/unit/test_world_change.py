"""A fixed-size run resumed at another world size keeps the checkpoint's global batch
(distributed_runner/data/world_change.py): stopped on 2 gloo ranks and resumed in this process,
or stopped in this process and resumed on 2 ranks, the resumed run fetches each sample it has
left once, none it trained before, in the uninterrupted run's order, and ends within 1e-5 of the
uninterrupted run's weights (the gradient is summed in another order); a world size that cannot
split the saved global batch is one line before training."""
import logging
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.data.loaders import build_dataloader, epoch_order
from distributed_runner.data.world_change import kept_global_batch
from tests.docs_blocks import docs_text
from tests.toy import ToyDataset
from tests.unit.test_elastic import cfg as elastic_cfg
from tests.unit.test_elastic import on_two_ranks, relative_gap, weights


N = 67  # samples: a prime, so that no number of ranks or global batch divides it


def cfg(work_dir: Path, record: Path | None = None, batch_size: int = 4, **extra) -> dict:
    """test_elastic's run (TinyBlocks, AdamW with a warm-up by iteration, 12 iterations,
    checkpoints every 4) over N samples, with a fixed launcher, accumulation over 2 iterations
    and the fetched samples recorded: global batches of 4 x ranks."""
    out = elastic_cfg(work_dir, batch_size=batch_size)
    del out["launcher"]
    out["train_dataloader"]["dataset"]["n"] = N
    out["train_dataloader"]["dataset"]["record"] = str(record) if record else None
    out["optim_wrapper"]["accumulative_counts"] = 2
    out.update(extra)
    return out


def fetched(record: Path) -> list[int]:
    return [int(line.split()[1]) for line in record.read_text().splitlines()]


@pytest.mark.slow("a group of gloo processes runs twice, beside two runs in this process")
def test_stopped_at_one_world_size_and_resumed_at_another_each_sample_once_same_weights(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    shrunk, grown = tmp_path / "shrunk.txt", tmp_path / "grown.txt"
    alone = Runner.from_cfg(cfg(one))  # 12 iterations of global batches of 4, in this process
    alone.train()
    reference_one = weights(alone)
    # on 2 ranks: 12 iterations of global batches of 8; then this process's iter_4 resumed; then
    # their iter_4 resumed with batch_size=6: a new global batch of 12 (test_new_global_batch)
    wider = tmp_path / "wider.txt"
    on_two_ranks(tmp_path, cfg(two), cfg(tmp_path / "grown", grown, resume=str(one / "iter_4.pth")),
                 cfg(tmp_path / "wider", wider, batch_size=6, resume=str(two / "iter_4.pth")))
    resumed = Runner.from_cfg(cfg(tmp_path / "shrunk", shrunk, resume=str(two / "iter_4.pth")))
    resumed.train()

    plan = resumed.elastic_plan  # 2 -> 1: each global batch of 8 as 2 micro-batches of 4
    assert (plan.kept_from, plan.micro_batches, plan.micro_batch) == (2, 2, 4)
    # 67 = 8 global batches of 8 and one of 3 an epoch: 9 iterations, every sample once
    assert resumed.iter == 12 and len(resumed.train_dataloader) == 9
    epoch0, epoch1 = epoch_order(N, True, 0, 0), epoch_order(N, True, 0, 1)
    # iterations 4..11: the rest of epoch 0 from sample 32 (its last 3 as iteration 8), then
    # epoch 1's first 24, in order: none fetched twice
    assert fetched(shrunk) == epoch0[32:] + epoch1[:24]
    assert relative_gap(weights(resumed), torch.load(two / "final.pt", weights_only=True)) < 1e-5

    # 1 -> 2: global batches of 4 as 2 samples a rank; iterations 4..11 are samples 16..47
    by_rank = fetched(grown)  # (67 = 16 global batches of 4 and one of 3 an epoch)
    assert len(by_rank) == 32 and sorted(by_rank) == sorted(epoch0[16:48])
    final = torch.load(tmp_path / "grown" / "final.pt", weights_only=True)
    assert relative_gap(final, reference_one) < 1e-5
    assert relative_gap(torch.load(one / "iter_4.pth")["state_dict"], reference_one) > 1e-2
    meta = torch.load(tmp_path / "grown" / "iter_8.pth")["meta"]
    assert (meta["global_batch"], meta["world_size"]) == (4, 2)

    # a new global batch of 12 from sample 32 (2 x 12 + 8): the 35 left of epoch 0 (2 of 12 and
    # the 11 left), then 60 of epoch 1; as one process with batch_size=12 trains them
    wide = Runner.from_cfg(cfg(tmp_path / "wide", tmp_path / "wide.txt", batch_size=12,
                               resume=str(two / "iter_4.pth")))
    wide.train()
    assert fetched(tmp_path / "wide.txt") == epoch0[32:] + epoch1[:60]
    assert sorted(fetched(wider)) == sorted(epoch0[32:] + epoch1[:60])
    final = torch.load(tmp_path / "wider" / "final.pt", weights_only=True)
    assert relative_gap(final, weights(wide)) < 1e-5


def _loader(batch_size: int = 4):
    spec = dict(dataset=dict(type="ToyDataset", n=64), batch_size=batch_size,
                sampler=dict(type="DefaultSampler", shuffle=True))
    return build_dataloader(spec, "train_dataloader", seed=0)


@pytest.mark.parametrize("resumed,world,kept", [
    ({}, 1, None),  # a fresh start
    (dict(world_size=2, mesh=[1, 2, 1]), 1, None),  # written before global_batch was recorded
    (dict(global_batch=8, world_size=2, mesh=[1, 2, 1]), 2, None),  # the same world size
    (dict(global_batch=8, world_size=2, mesh=[1, 2, 1]), 1, (2, 4, 2)),  # 2 -> 1
    (dict(global_batch=8, world_size=4, mesh=[2, 1, 2]), 1, (2, 4, 2)),  # HSDP x tp: 2 dp ranks
    (dict(global_batch=48, world_size=4, mesh=[1, 4, 1]), 2, (4, 4, 6)),  # 4 -> 2: 6 passes of 4
    (dict(global_batch=4, world_size=1, mesh=[1, 1, 1]), 4, (1, 1, 1)),  # 1 -> 4
])
def test_the_plan_keeps_the_saved_global_batch_only_when_the_world_size_changed(
        resumed, world, kept):
    plan = kept_global_batch(_loader(), world, 0, resumed, logging.getLogger("test"))
    if kept is None:
        assert plan is None
        return
    assert (plan.kept_from, plan.micro_batch, plan.micro_batches) == kept
    assert plan.micro_batch * plan.micro_batches * world == resumed["global_batch"]
    assert f"kept from the checkpoint's {kept[0]} ranks" in plan.describe()


def test_a_world_size_that_cannot_split_the_saved_global_batch_is_one_line():
    with pytest.raises(ConfigError) as refused:
        kept_global_batch(_loader(), 3, 0, dict(global_batch=8, mesh=[1, 2, 1]),
                          logging.getLogger("test"))
    text = str(refused.value)
    assert "\n" not in text and text.startswith("resume:")
    assert "global batches of 8 samples on 2 data-parallel ranks, which 3 cannot" in text


def test_a_changed_batch_size_or_a_loader_that_cannot_be_recut_says_what_happens(caplog):
    resumed = dict(global_batch=8, mesh=[1, 2, 1], samples=16)
    with caplog.at_level(logging.INFO):
        assert kept_global_batch(_loader(batch_size=2), 2, 0, resumed, logging.getLogger("t"))\
            is None  # batch_size edited at the same world size: a new global batch
        plain = DataLoader(ToyDataset(64), batch_size=4, shuffle=True)  # torch's own sampler
        assert kept_global_batch(plain, 1, 0, resumed, logging.getLogger("t")) is None
    first, second = (r.getMessage() for r in caplog.records)
    assert "this run's are 4: it goes on at sample 16 of the data pass" in first
    assert "only DefaultSampler's DataLoader or StreamingLoader can keep" in second


def test_an_edited_batch_size_at_another_world_size_is_a_new_global_batch_not_a_kept_one():
    resumed = dict(global_batch=8, mesh=[1, 2, 1], batch_size=4, samples=24)
    log = logging.getLogger("t")
    assert kept_global_batch(_loader(batch_size=4), 1, 0, resumed, log).kept_from == 2  # kept
    assert kept_global_batch(_loader(batch_size=6), 4, 0, resumed, log) is None  # asked: 24
    with pytest.raises(ConfigError) as refused:  # 24 samples done: 5 ranks cannot share them
        kept_global_batch(_loader(batch_size=2), 5, 0, resumed, log)
    text = str(refused.value)
    assert "\n" not in text and text.startswith("resume:")
    assert "stopped at sample 24 of its data pass, which 5 data-parallel ranks" in text
    assert "resume with the checkpoint's batch_size (4)" in text
    assert text in " ".join(docs_text().split())  # the line docs/how-to/resume.md quotes
