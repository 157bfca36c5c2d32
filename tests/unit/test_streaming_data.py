"""StreamingLoader over ParquetShards (distributed_runner/data/streaming): Parquet files written
here with pyarrow, several files and row groups of uneven sizes, read as a training run reads them.

The order is a function of (seed, epoch): every sample once per epoch at 1, 2 and 4 ranks, with
and without loader workers, and the same global batches at every size; a run resumed by position
(at the same size or another) continues at the first global batch not yet trained and passes no
trained sample through its pipeline; a Runner trained on it resumes exactly; each bad input is one
line before training."""
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import TRANSFORMS
from distributed_runner.data.elastic import GlobalBatchPlan, MicroBatches
from distributed_runner.data.loaders import build_dataloader
from distributed_runner.data.streaming import EpochOrder, ParquetShards, ShardReadError
from distributed_runner.data.streaming import shards as shards_module
from tests.toy import ToyDataset, assert_state_equal, params_of
from tests.unit.test_elastic import on_two_ranks, relative_gap

ROWS = 997  # prime: streams and batches never divide it


def write_shards(folder, rows=ROWS, files=5, row_group=47):
    """ToyDataset's samples as Parquet: ``inputs`` a fixed-size list of 4 floats, ``labels``,
    ``index`` (the row's number, to follow it); files of uneven length, row groups of 47."""
    data = ToyDataset(n=rows)
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int) + np.arange(files + 1) * 3
    bounds[-1] = rows
    for f, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        inputs = data.x[lo:hi].numpy().astype(np.float32).reshape(-1)
        table = pa.table({
            "inputs": pa.FixedSizeListArray.from_arrays(pa.array(inputs), 4),
            "labels": pa.array(data.y[lo:hi].numpy().astype(np.int64)),
            "index": pa.array(np.arange(lo, hi, dtype=np.int64)),
            "note": pa.array([f"row {i}" for i in range(lo, hi)]),
        })
        pq.write_table(table, folder / f"part-{f:03d}.parquet", row_group_size=row_group)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards") / "train")


def loader(folder, world=1, rank=0, batch_size=8, **extra):
    spec = dict(type="StreamingLoader", dataset=dict(type="ParquetShards", paths=str(folder)),
                batch_size=batch_size, num_streams=8, shuffle_window=32, rank=rank,
                world_size=world)
    spec.update(extra)
    return build_dataloader(spec, "train_dataloader", seed=7)


def counted(batch):
    """The batches in what a loader yields: itself, or of a share of micro-batches those that
    count (the epoch's last, smaller global batch on several ranks pads with weight-0 passes)."""
    if isinstance(batch, MicroBatches):
        weights = batch.weights or [1] * len(batch)
        return [micro for micro, w in zip(batch, weights, strict=True) if w > 0]
    return [batch]


def indices(batch):
    return [i for part in counted(batch) for i in part["index"].tolist()]


def global_batches(folder, world, batch_size, start=0, epoch=0, **extra):
    """The epoch's global batches as the ranks of a ``world``-sized group take them (rank r
    holds every world-th sample of each, from r; of the last, smaller one, those below the end)."""
    per_rank = []
    for rank in range(world):
        ld = loader(folder, world, rank, batch_size, **extra)
        ld.sampler.set_epoch(epoch)
        ld.sampler.resume_at(start * batch_size)
        per_rank.append([indices(b) for b in ld])
    out = []
    for g in range(len(per_rank[0])):
        batch = [0] * sum(len(per_rank[rank][g]) for rank in range(world))
        for rank in range(world):
            batch[rank::world] = per_rank[rank][g]
        out.append(batch)
    return out


# -- the order -----------------------------------------------------------------------------------
def test_every_sample_once_an_epoch_and_the_same_global_batches_at_any_size(data):
    alone = global_batches(data, 1, 8)
    flat = [i for batch in alone for i in batch]
    assert len(alone) == 125 and len(alone[-1]) == ROWS - 124 * 8  # the last: the 5 left
    assert sorted(flat) == list(range(ROWS))  # every row once: none left out, none twice
    assert global_batches(data, 2, 4) == alone
    assert global_batches(data, 4, 2, num_workers=2) == alone  # and with loader workers
    assert global_batches(data, 1, 8, num_workers=2) == alone
    other_epoch = [i for batch in global_batches(data, 1, 8, epoch=1) for i in batch]
    assert other_epoch != flat and len(set(other_epoch)) == len(other_epoch)
    ordered = [i for batch in global_batches(data, 1, 8, shuffle=False) for i in batch]
    assert ordered != sorted(ordered)  # interleaved streams, not the file order...
    assert sorted(ordered) == sorted(set(ordered))


def test_a_position_names_its_sample_without_reading_anything(data):
    shards = ParquetShards(str(data))
    order = EpochOrder([b.rows for b in shards.blocks], 8, 32, True, 7, 0)
    first = global_batches(data, 1, 8)[0]
    for position, index in enumerate(first):
        block, row, _ = order.source_of(position)
        table = shards.read_block(shards.blocks[block])
        assert table.column("index")[row].as_py() == index


def test_the_shuffle_mixes_the_whole_data_set_into_every_batch(data):
    first = global_batches(data, 1, 8)[:4]
    spread = [max(b) - min(b) for b in first]
    assert min(spread) > ROWS // 4  # a batch draws from streams far apart


# -- resume by position --------------------------------------------------------------------------
@TRANSFORMS.register_module(force=True)
class RecordIndex:
    """A pipeline step that appends each sample's index to a file (workers are processes) and
    adds a feature, as a real transform would."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, sample: dict) -> dict:
        with open(self.path, "a") as f:
            f.write(f"{int(sample['index'])}\n")
        sample["noise"] = torch.rand(2)  # a random draw, seeded by position
        return sample


def recorded(path):
    return [int(line) for line in open(path).read().split()] if os.path.exists(path) else []


@pytest.mark.parametrize("world,workers", [(1, 0), (2, 2)])
def test_resume_starts_at_the_first_untrained_batch_and_decodes_nothing_trained(
        data, tmp_path, world, workers):
    whole = global_batches(data, 1, 8)
    log = tmp_path / "seen.txt"
    pipeline = [dict(type="RecordIndex", path=str(log))]
    resumed = global_batches(data, world, 8 // world, start=111, num_workers=workers,
                             pipeline=pipeline)
    assert resumed == whole[111:]  # 90 % into the epoch, at another size
    trained = {i for batch in whole[:111] for i in batch}
    assert not trained & set(recorded(log))  # no trained sample went through the pipeline
    assert sorted(recorded(log)) == sorted(i for batch in whole[111:] for i in batch)


def test_random_transforms_draw_the_same_numbers_at_any_size_and_after_a_resume(data, tmp_path):
    def noise(world, start):
        out = {}
        for rank in range(world):
            ld = loader(data, world, rank, 8 // world, num_workers=world,
                        pipeline=[dict(type="RecordIndex", path=str(tmp_path / "x"))])
            ld.sampler.resume_at(start * (8 // world))
            for b in ld:
                for part in counted(b):
                    out.update(zip(part["index"].tolist(), part["noise"].tolist()))
        return out

    alone, pair = noise(1, 0), noise(2, 100)
    assert pair and all(alone[i] == pair[i] for i in pair)


def test_an_elastic_plan_yields_each_ranks_share_in_micro_batches(data):
    """Global batches of 8 in micro-batches of 2; the epoch's last, of the 5 samples left, as
    weighted micro-batches: as many on every rank, the weights w x rows / 5 (0 for padding),
    so that the ranks' mean of the weighted losses is the mean over the 5."""
    whole = global_batches(data, 1, 8)
    for world in (1, 2):
        shares, lasts = [], []
        for rank in range(world):
            ld = loader(data, world, rank, batch_size=2)
            ld.use_global_batches(GlobalBatchPlan.build(8, 2, world, rank))
            ld.sampler.resume_at(3)  # global batches, as for any elastic loader
            *groups, last = list(ld)
            assert all(isinstance(g, MicroBatches) and len(g) == 4 // world for g in groups)
            assert all(g.weights is None for g in groups)
            shares.append([indices(g) for g in [*groups, last]])
            lasts.append(last)
        assert len({len(last) for last in lasts}) == 1  # as many forward passes on each rank
        assert sum(sum(last.weights) for last in lasts) == pytest.approx(world)
        expected = {1: [0.4, 0.4, 0.2], 2: [0.8, 0.4, 0.8, 0.0]}[world]  # rank 0's, rank 1's
        assert [w for last in lasts for w in last.weights] == pytest.approx(expected)
        rebuilt = [[0] * sum(len(share[g]) for share in shares) for g in range(len(shares[0]))]
        for rank, share in enumerate(shares):
            for g, part in enumerate(share):
                rebuilt[g][rank::world] = part
        assert rebuilt == whole[3:]


def test_drop_last_leaves_the_last_smaller_global_batch_out(data):
    dropped = global_batches(data, 2, 4, drop_last=True)
    assert dropped == global_batches(data, 1, 8)[:124]
    assert len(loader(data, 2, 0, 4, drop_last=True)) == 124


# -- a Runner trained on it ----------------------------------------------------------------------
def runner_cfg(work_dir, folder, **extra):
    cfg = dict(
        work_dir=str(work_dir), run_name=".", model=dict(type="ToyModel", dropout=0.0),
        train_dataloader=dict(type="StreamingLoader", batch_size=16, num_streams=8,
                              shuffle_window=64,
                              dataset=dict(type="ParquetShards", paths=str(folder),
                                           columns=["inputs", "labels", "index"])),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=25, by_epoch=False),
                           logger=dict(type="LoggerHook", interval=10, sinks=["jsonl"])),
        randomness=dict(seed=3), log_level="WARNING")
    cfg.update(extra)
    return cfg


def test_a_run_resumed_mid_epoch_ends_with_the_uninterrupted_runs_weights(data, tmp_path):
    whole = Runner.from_cfg(runner_cfg(tmp_path / "whole", data))
    whole.train()
    # 62 global batches of 16 and the last of 5 an epoch: every one of the 997 rows, once
    assert whole.iter == 2 * 63 and sorted(whole.model.seen[:ROWS]) == list(range(ROWS))
    assert len(whole.model.seen) == 2 * ROWS
    resumed = Runner.from_cfg(runner_cfg(tmp_path / "resumed", data,
                                         resume=str(tmp_path / "whole" / "iter_75.pth")))
    resumed.train()
    assert resumed.model.seen == whole.model.seen[ROWS + (75 - 63) * 16:]
    assert_state_equal(params_of(resumed.model), params_of(whole.model))


@pytest.mark.slow("a group of 2 gloo processes trains an epoch")
def test_on_two_ranks_the_last_batch_of_one_sample_trains_as_one_process_would(data, tmp_path):
    """997 rows in global batches of 12: 83, then one of the 1 sample left, which is rank 0's;
    rank 1 passes one of its samples weighted 0 (DDP's all-reduce needs it). The 2-rank epoch
    ends within 1e-5 of the one-process epoch with batch 12, which trains that sample alone."""
    def cfg(name, batch_size):  # TinyBlocks: LayerNorm, no batch statistics
        spec = runner_cfg(tmp_path, data)["train_dataloader"]
        spec["dataset"]["columns"] = ["inputs", "labels"]
        return runner_cfg(tmp_path / name, data, model=dict(type="TinyBlocks"),
                          train_cfg=dict(by_epoch=True, max_epochs=1),
                          train_dataloader={**spec, "batch_size": batch_size})

    alone = Runner.from_cfg(cfg("alone", 12))
    alone.train()
    assert alone.iter == 84 == len(alone.train_dataloader)
    on_two_ranks(tmp_path, cfg("pair", 6))
    final = torch.load(tmp_path / "pair" / "final.pt", weights_only=True)
    assert relative_gap(final, params_of(alone.model)) < 1e-5
    before = torch.load(tmp_path / "pair" / "iter_75.pth", weights_only=False)["state_dict"]
    assert relative_gap(before, final) > 1e-3  # the iterations after it trained


# -- bad input, one line -------------------------------------------------------------------------
def one_line(excinfo):
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_bad_input_is_one_line_naming_the_key_or_the_file(data, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as e:
        loader(tmp_path / "empty")
    assert one_line(e).startswith("train_dataloader.dataset.paths: no Parquet file in ")
    with pytest.raises(ConfigError) as e:
        loader(data, dataset=dict(type="ParquetShards", paths=str(data), columns=["lables"]))
    assert "train_dataloader.dataset.columns: 'lables' is not a column of" in one_line(e)
    broken = write_shards(tmp_path / "broken", rows=200, files=2)
    cut = broken / "part-001.parquet"
    cut.write_bytes(cut.read_bytes()[:-100])  # truncated: its footer is gone
    with pytest.raises(ConfigError) as e:
        loader(broken)
    assert f"{cut} is not a readable Parquet file" in one_line(e)
    with pytest.raises(ConfigError) as e:
        loader(data, world=3, rank=0)
    assert one_line(e).startswith("train_dataloader.num_streams: 8 streams cannot be split "
                                  "over 3 ranks: set it to a multiple of 3")
    with pytest.raises(ConfigError) as e:
        loader(data, batch_size=200, world=8)
    assert "fewer than one global batch (1600)" in one_line(e)
    with pytest.raises(ConfigError) as e:
        loader(data, shuffle_window=0)
    assert one_line(e).startswith("train_dataloader.shuffle_window: must be an integer >= 1")


def test_a_shard_lost_mid_run_is_retried_then_one_line_naming_it(tmp_path, monkeypatch):
    folder = write_shards(tmp_path / "flaky", rows=300, files=3)
    ld = loader(folder)
    monkeypatch.setattr(shards_module, "RETRY_PAUSE_S", 0.01)
    victim = folder / "part-002.parquet"
    victim.write_bytes(b"gone")  # after the footers were read: storage lost it
    with pytest.raises(ShardReadError) as e:
        list(ld)
    assert one_line(e).startswith(f"{victim} row group ")
    assert "unreadable after 3 tries" in str(e.value)


class CorruptShardsAt:
    """A hook that overwrites every shard after iteration ``at`` (storage losing the files
    under a running job)."""

    priority = "LOW"

    def __init__(self, folder, at):
        self.folder, self.at = folder, at

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter == self.at:
            for path in self.folder.glob("*.parquet"):
                path.write_bytes(b"lost")


def test_shards_lost_under_a_running_job_stop_it_in_one_line_with_its_checkpoints_intact(
        tmp_path, monkeypatch):
    from distributed_runner.data.streaming import loader as loader_module
    from hooks import Hook

    folder = write_shards(tmp_path / "data", rows=400, files=4, row_group=10)
    monkeypatch.setattr(shards_module, "RETRY_PAUSE_S", 0.01)
    monkeypatch.setattr(loader_module, "CHUNK_ROWS", 16)  # read as it goes, not all at once
    hook = type("Corrupt", (CorruptShardsAt, Hook), {})(folder, at=12)
    cfg = runner_cfg(tmp_path / "wd", folder, train_cfg=dict(by_epoch=False, max_iters=40),
                     custom_hooks=[hook])
    cfg["train_dataloader"].update(batch_size=4, num_workers=1, shuffle_window=4)
    cfg["default_hooks"]["checkpoint"] = dict(type="CheckpointHook", interval=10, by_epoch=False)
    runner = Runner.from_cfg(cfg)
    with pytest.raises(ShardReadError) as e:
        runner.train()
    assert one_line(e).startswith(str(folder / "part-00"))
    assert "unreadable after 3 tries" in str(e.value)
    saved = torch.load(tmp_path / "wd" / "iter_10.pth", weights_only=False)
    assert saved["meta"]["iter"] == 10


def test_a_pipeline_written_on_the_dataset_as_in_mmengine_is_the_loaders(data, tmp_path):
    """``dataset=dict(type='ParquetShards', ..., pipeline=[...])`` (issue 48): the loader runs
    it, as it runs its own ``pipeline``; the same batches, the same random draws. Given in both
    places, or with a transform that does not exist, it is one line naming the key written."""
    def batches(**where):
        ld = loader(data, num_workers=0, **where)
        return [(b["index"].tolist(), b["noise"].tolist()) for b in ld]

    steps = [dict(type="RecordIndex", path=str(tmp_path / "seen.txt"))]
    on_dataset = batches(dataset=dict(type="ParquetShards", paths=str(data), pipeline=steps))
    assert on_dataset == batches(pipeline=steps)
    assert len(recorded(tmp_path / "seen.txt")) == 2 * sum(len(i) for i, _ in on_dataset)
    with pytest.raises(ConfigError) as both:
        loader(data, pipeline=steps,
               dataset=dict(type="ParquetShards", paths=str(data), pipeline=steps))
    assert str(both.value) == ("train_dataloader.dataset.pipeline: given with "
                               "train_dataloader.pipeline: keep one of them (the loader runs either)")
    with pytest.raises(ConfigError, match=r"^train_dataloader\.dataset\.pipeline\[0\]"):
        loader(data, dataset=dict(type="ParquetShards", paths=str(data),
                                  pipeline=[dict(type="NoSuchTransform")]))


# -- Arrow to NumPy ------------------------------------------------------------------------------
def test_columns_convert_as_arrows_own_to_numpy_without_importing_pandas(data):
    from distributed_runner.data.streaming.columns import column_array

    numbers = pa.array(np.arange(10, dtype=np.float32)).slice(3, 4)  # an offset into its buffer
    lists = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int64)), 3)
    for array, expected in [
        (numbers, np.arange(3, 7, dtype=np.float32)),
        (pa.chunked_array([pa.array([1, 2], pa.uint16()), pa.array([3], pa.uint16())]),
         np.array([1, 2, 3], np.uint16)),
        (lists.slice(1, 2), np.arange(3, 9).reshape(2, 3)),
        (pa.array([1.5, None]), np.array([1.5, np.nan])),  # nulls: Arrow's own conversion
        (pa.array([True, False]), np.array([True, False])),
    ]:
        got = column_array(array)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == expected.dtype
    # a first batch imports no pandas (pyarrow's pa.array and to_numpy would: 0.3 s)
    code = ("import sys; from distributed_runner.data.loaders import build_dataloader; "
            f"ld = build_dataloader(dict(type='StreamingLoader', batch_size=8, rank=0, "
            f"world_size=1, dataset=dict(type='ParquetShards', paths={str(data)!r}, "
            "columns=['inputs', 'labels', 'index'])), 'train_dataloader', seed=0); "
            "next(iter(ld)); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
