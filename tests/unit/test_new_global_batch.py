"""A resume that asks for a new global batch (its ``train_dataloader.batch_size`` differs from the
checkpoint's) goes on at the saved data pass's sample position (distributed_runner/data/
world_change.py): the samples of that pass not yet trained, each once, in global batches of the
new size cut from there, whatever the position; ``iter`` goes on from the saved count; the
checkpoints written after it record the position exactly, so a second resume goes on from it.
For DefaultSampler's DataLoader, the global-batch re-cut and StreamingLoader (simulated ranks
here; two gloo ranks in test_world_change)."""
import shlex

import pytest
import torch

from distributed_runner import Runner
from distributed_runner.cli import main
from distributed_runner.data.elastic import GlobalBatchPlan, GlobalBatchSampler
from distributed_runner.data.loaders import epoch_order
from tests.docs_blocks import docs_commands
from tests.toy import ToyDataset, params_of
from tests.unit.test_elastic import relative_gap
from tests.unit.test_streaming_data import ROWS, data, indices, loader, runner_cfg  # noqa: F401
from tests.unit.test_world_change import N, cfg, fetched


def interleave(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Global batches from each rank's batches (rank r holds every w-th sample of each, from r)."""
    world, out = len(per_rank), []
    for step in range(len(per_rank[0])):
        batch = [0] * sum(len(per_rank[r][step]) for r in range(world))
        for rank in range(world):
            batch[rank::world] = per_rank[rank][step]
        out.append(batch)
    return out


def cut(order: list[int], first: int, size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(first, len(order), size)]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_global_batch_sampler_cuts_the_rest_of_the_pass_from_any_sample(world):
    data_set, order = ToyDataset(n=N), epoch_order(N, True, 3, 0)
    per_rank = []
    for rank in range(world):
        sampler = GlobalBatchSampler(data_set, GlobalBatchPlan.build(12, 12 // world, world, rank),
                                     seed=3)
        sampler.resume_at_position(2, 8)  # sample 32: inside the third global batch of 12
        per_rank.append(list(sampler))
        assert list(sampler)[0] == order[rank:12:world]  # the next pass: from its start
    assert interleave(per_rank) == cut(order, 32, 12)  # 35 left: 2 of 12, then the 11 left


@pytest.mark.parametrize("world", [1, 2])
def test_a_streamed_pass_goes_on_at_any_sample_in_global_batches_of_the_new_size(data, world):
    whole = [i for rank_batch in _batches(data, 1, 8, 0, 0) for i in rank_batch]
    assert sorted(whole) == list(range(ROWS))
    resumed = interleave([_batches(data, world, 12 // world, rank, 40) for rank in range(world)])
    assert resumed == cut(whole, 40, 12)  # 957 left: 79 of 12 and the 9 left, none twice


def _batches(folder, world, batch_size, rank, position):
    ld = loader(folder, world, rank, batch_size)
    ld.sampler.resume_at_position(*divmod(position, batch_size * world))
    return [indices(b) for b in ld]


def test_a_run_resumed_with_another_batch_size_goes_on_at_the_first_sample_not_trained(tmp_path):
    """Global batches of 4 stopped at iteration 4 (16 samples done), resumed with batches of 6:
    16 = 2 x 6 + 4, so the rest of the epoch is cut from sample 16 (8 of 6, then the 3 left),
    then epoch 1 from its start; the resumed run's checkpoint records sample 40, and a resume
    from it goes on there and ends with the first resumed run's weights."""
    first = tmp_path / "first"
    Runner.from_cfg(cfg(first)).train()
    assert torch.load(first / "iter_4.pth")["meta"]["samples_in_epoch"] == 16
    record, config = tmp_path / "wider.txt", tmp_path / "cfg.py"
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in cfg(tmp_path / "wider", record).items()))
    # the documented form (docs/how-to/resume.md): the config as it was, the new batch size on
    # the command line
    (command,) = docs_commands("resume-new-global-batch")
    words = shlex.split(command)
    assert words[:3] == ["drun", "train", "cfg.py"] and words[3] == "--resume"
    assert words[5:] == ["--cfg-options", "train_dataloader.batch_size=6"]
    words[2], words[4] = str(config), str(first / "iter_4.pth")
    assert main([*words[1:], "train_cfg.max_iters=14"]) == 0
    epoch0, epoch1 = epoch_order(N, True, 0, 0), epoch_order(N, True, 0, 1)
    assert fetched(record) == epoch0[16:] + epoch1[:6]  # none trained twice, none skipped
    final = torch.load(tmp_path / "wider" / "last.pth")  # saved as training ends: iteration 14
    assert (final["meta"]["iter"], final["meta"]["epoch"], final["meta"]["samples_in_epoch"]) \
        == (14, 1, 6)
    meta = torch.load(tmp_path / "wider" / "iter_8.pth")["meta"]
    assert (meta["samples_in_epoch"], meta["iter_in_epoch"], meta["global_batch"],
            meta["batch_size"]) == (40, 6, 6, 6)  # 16 + 4 x 6; 40 = 6 x 6 + 4
    longer = dict(by_epoch=False, max_iters=14)

    again = tmp_path / "again.txt"
    second = Runner.from_cfg(cfg(tmp_path / "again", again, batch_size=6, train_cfg=longer,
                                 resume=str(tmp_path / "wider" / "iter_8.pth")))
    second.train()
    assert fetched(again) == epoch0[40:] + epoch1[:6]
    wider = final["state_dict"]
    assert len(second.train_dataloader) == 12  # ceil(67 / 6) from epoch 1 on
    assert relative_gap(params_of(second.model), wider) < 1e-6

    # last.pth, saved as training ended, is inside epoch 1: a higher max_iters goes on there
    more = tmp_path / "more.txt"
    Runner.from_cfg(cfg(tmp_path / "more", more, batch_size=6, resume=str(tmp_path / "wider" /
                        "last.pth"), train_cfg=dict(by_epoch=False, max_iters=16))).train()
    assert fetched(more) == epoch1[6:18]


def test_a_streamed_run_resumed_with_another_batch_size_trains_each_row_once(data, tmp_path):
    whole = Runner.from_cfg(runner_cfg(tmp_path / "whole", data))
    whole.train()  # 16 a batch: iteration 75 is epoch 1's 12th, 192 of its rows done
    spec = {**runner_cfg(tmp_path, data)["train_dataloader"], "batch_size": 20}
    resumed = Runner.from_cfg(runner_cfg(tmp_path / "resumed", data, train_dataloader=spec,
                                         resume=str(tmp_path / "whole" / "iter_75.pth")))
    resumed.train()
    assert resumed.model.seen == whole.model.seen[ROWS + 192:]  # 192 = 9 x 20 + 12
    assert resumed.iter == 75 + 41  # 805 rows left: 40 of 20 and the 5 left
    meta = torch.load(tmp_path / "resumed" / "iter_100.pth")["meta"]
    assert meta["samples_in_epoch"] == 192 + 25 * 20
