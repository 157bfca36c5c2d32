"""StreamingLoader at scale and with its defaults (issue 48): the shards' index read once per
run (data/streaming/index.py), so a rank's requests at startup do not grow with the number of
files; ``num_streams`` chosen from the data and the world sizes, and kept by a resume; the
windows a chunk starts in read side by side.

Requests are counted on a pyarrow filesystem that records every file it opens (real Parquet
bytes behind it); 100,000 files are synthetic: an index naming them, one small Parquet file's
bytes behind every name."""
import io
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from distributed_runner.core.errors import ArgumentError, ConfigError
from distributed_runner.data.loaders import build_dataloader
from distributed_runner.data.streaming import ParquetShards, StreamingLoader
from distributed_runner.data.streaming import shards as shards_module
from distributed_runner.data.streaming.index import Block, ShardIndex
from distributed_runner.data.world_change import kept_stream_count
from tests.unit.test_streaming_data import write_shards
from tests.unit.test_streaming_pack import corpus  # noqa: F401  (a fixture)


class CountingFS:
    """A filesystem that counts the files it opens (every footer or row-group read opens one);
    ``data``: the bytes every path holds (synthetic files), else the local file's."""

    def __init__(self, data: bytes | None = None, delay_s: float = 0.0):
        self.local, self.data, self.delay_s = pafs.LocalFileSystem(), data, delay_s
        self.opened: list[str] = []
        self.lock = threading.Lock()

    def open_input_file(self, path):
        with self.lock:
            self.opened.append(path)
        time.sleep(self.delay_s)  # object storage's latency, per request
        if self.data is not None:
            return pa.BufferReader(self.data)
        return self.local.open_input_file(path)

    def __getattr__(self, name):  # listing, file info: the local filesystem's
        return getattr(self.local, name)


@pytest.fixture()
def counting(monkeypatch):
    """Every ParquetShards opened from here on reads through one CountingFS."""
    fs = CountingFS()
    monkeypatch.setattr(shards_module, "_open_filesystem", lambda path, options: (fs, path))
    return fs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards") / "train")


def streamed(folder, index=None, **extra):
    dataset = dict(type="ParquetShards", paths=str(folder))
    if index is not None:
        dataset["index"] = str(index)
    spec = dict(type="StreamingLoader", dataset=dataset, batch_size=8, num_streams=8,
                shuffle_window=32, rank=0, world_size=1)
    spec.update(extra)
    return build_dataloader(spec, "train_dataloader", seed=7)


def test_a_rank_with_the_index_reads_no_footer_and_the_same_samples(data, tmp_path, counting):
    footers = ParquetShards(str(data))
    assert len(counting.opened) == len(footers.files) == 5  # one footer a file
    uri = tmp_path / "data_index" / "train_dataloader.arrow"
    footers.index().write(str(uri))
    counting.opened.clear()
    indexed = ParquetShards(str(data), index=str(uri))
    assert counting.opened == []  # not one footer
    assert indexed.blocks == footers.blocks and indexed.files == footers.files
    assert indexed.schema.equals(footers.schema) and indexed.columns == footers.columns

    def indices(loader):
        return [i for batch in loader for i in batch["index"].tolist()]

    assert indices(streamed(data, index=uri)) == indices(streamed(data))
    with pytest.raises(ArgumentError, match="^columns: 'nope' is not a column of the data"):
        ParquetShards(str(data), columns=["nope"], index=str(uri))
    (tmp_path / "bad.arrow").write_bytes(b"not arrow")
    with pytest.raises(ArgumentError, match=r"^index: cannot read the shard index .*bad\.arrow"):
        ParquetShards(str(data), index=str(tmp_path / "bad.arrow"))


def synthetic_index(tmp_path, files, rows_per_file=100):
    """An index of ``files`` files of one row group each, and the bytes each of them holds."""
    table = pa.table({"inputs": pa.FixedSizeListArray.from_arrays(
        pa.array(np.zeros(rows_per_file * 4, np.float32)), 4),
        "labels": pa.array(np.arange(rows_per_file, dtype=np.int64))})
    out = io.BytesIO()
    pq.write_table(table, out)
    names = [f"bucket/part-{i:06d}.parquet" for i in range(files)]
    index = ShardIndex(names, [f"s3://{n}" for n in names],
                       [Block(i, 0, rows_per_file) for i in range(files)], table.schema)
    uri = tmp_path / f"index-{files}.arrow"
    index.write(str(uri))
    return uri, out.getvalue()


def startup_requests(uri, payload, monkeypatch, world, ranks):
    """Per rank of ``world``: the files its loader opens until its first batch (the index read
    aside, one request), with the default num_streams; and the streams each rank reads."""
    fs = CountingFS(payload)
    monkeypatch.setattr(shards_module, "_open_filesystem", lambda path, options: (fs, path))
    shards = ParquetShards("/synthetic", index=str(uri))
    assert fs.opened == []
    counts, streams = [], set()
    for rank in ranks:
        loader = StreamingLoader(shards, batch_size=4, shuffle_window=256, rank=rank,
                                 world_size=world)
        assert fs.opened == []  # building the loader reads nothing
        next(iter(loader))
        counts.append(len(set(fs.opened)))
        streams.add(loader.num_streams // world)
        fs.opened.clear()
    return counts, streams


def test_1024_ranks_over_100000_files_read_their_own_streams_only(tmp_path, monkeypatch):
    """Today's reader read every footer on every rank: 10^8 requests before the first step.
    With the index a rank opens the row groups of its streams' first windows: the same count
    at 1,000 and at 100,000 files (1 stream a rank: 1024 streams on 1024 ranks)."""
    small, payload = synthetic_index(tmp_path, 1_000)
    large, _ = synthetic_index(tmp_path, 100_000)
    ranks = range(0, 1024, 31)  # 34 ranks spread over the 1,024 (all of them: same figures)
    at_1k, streams_1k = startup_requests(small, payload, monkeypatch, 1024, ranks)
    at_100k, streams_100k = startup_requests(large, payload, monkeypatch, 1024, ranks)
    assert streams_1k == streams_100k == {1}
    # a stream's first window (256 rows, or the whole stream of 97 or 98 rows at 1,000 files)
    # spans at most 4 row groups of 100: bounded by the rank's streams, not by the files
    assert min(at_1k) >= 1 and max(at_1k) <= 2
    assert min(at_100k) >= 3 and max(at_100k) <= 4


def test_the_first_batch_reads_its_streams_windows_side_by_side(data, monkeypatch):
    """64 streams whose first windows each wait 50 ms for storage: one after another that is
    over 3 s before the first batch; side by side it is a few waits."""
    fs = CountingFS(delay_s=0.05)
    monkeypatch.setattr(shards_module, "_open_filesystem", lambda path, options: (fs, path))
    loader = streamed(data, num_streams=64, shuffle_window=8)
    fs.opened.clear()
    start = time.perf_counter()
    next(iter(loader))
    took = time.perf_counter() - start
    assert len(fs.opened) >= 64  # every stream's first window, at least one row group each
    assert took < 0.05 * len(fs.opened) / 4, (took, len(fs.opened))


def test_the_default_num_streams_fits_the_data_and_every_world_size(data):
    def chosen(world, folder=data):
        spec = dict(type="StreamingLoader", batch_size=2, rank=0, world_size=world,
                    dataset=dict(type="ParquetShards", paths=str(folder)))
        return build_dataloader(spec, "train_dataloader", seed=0).num_streams

    assert [chosen(w) for w in (1, 2, 3, 4, 5, 8)] == [64, 64, 48, 64, 40, 64]
    few = write_shards(data.parent / "few", rows=40, files=2, row_group=7)
    assert chosen(1, few) == 32 and chosen(3, few) == 24  # 40 rows: every stream a row


def test_a_200_document_corpus_packs_with_the_defaults(corpus, tmp_path):  # noqa: F811
    """The issue's case: 200 token documents in 4 row groups, which the old default of 64
    streams refused ("leave 64 streams no full global batch")."""
    folder, docs = corpus
    table = pq.read_table(folder).slice(0, 200)
    small = tmp_path / "docs"
    small.mkdir()
    pq.write_table(table, small / "docs.parquet", row_group_size=50)
    assert pq.ParquetFile(small / "docs.parquet").metadata.num_row_groups == 4
    loader = build_dataloader(
        dict(type="StreamingLoader", batch_size=4, rank=0, world_size=1,
             dataset=dict(type="ParquetShards", paths=str(small), columns=["tokens"]),
             pack=dict(column="tokens", seq_len=16, eos_token_id=0)),
        "train_dataloader", seed=0)
    rows = [row for batch in loader for row in batch["input_ids"].tolist()]
    assert loader.num_streams < 64 and len(rows) >= 4
    assert all(len(row) == 16 for row in rows)


def test_a_resume_keeps_the_checkpoints_stream_count_at_another_world_size(data):
    loader = build_dataloader(dict(type="StreamingLoader", batch_size=2, rank=0, world_size=1,
                                   dataset=dict(type="ParquetShards", paths=str(data))),
                              "train_dataloader", seed=0)
    assert loader.num_streams == 64
    kept_stream_count(loader, (1, 1), {"num_streams": 48})  # written by a run on 3 ranks
    assert loader.num_streams == 48 and loader.fingerprint()["num_streams"] == 48
    kept_stream_count(loader, (2, 3), {})  # an elastic group of 2 or 3: a multiple of 6
    assert loader.num_streams == 48
    two = build_dataloader(dict(type="StreamingLoader", batch_size=2, rank=0, world_size=2,
                                dataset=dict(type="ParquetShards", paths=str(data))),
                           "train_dataloader", seed=0)
    with pytest.raises(ConfigError, match="^resume: the checkpoint's run read its data in 45 "):
        kept_stream_count(two, (2, 2), {"num_streams": 45})
    given = streamed(data)  # num_streams=8 given: the config's, whatever the checkpoint says
    kept_stream_count(given, (1, 1), {"num_streams": 48})
    assert given.num_streams == 8
