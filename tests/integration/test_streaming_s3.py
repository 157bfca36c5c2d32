"""StreamingLoader reading its shards from an S3-compatible server (moto's, on 127.0.0.1) the way
a user points it there: ``paths='s3://bucket/prefix'`` and the standard AWS variables
(``AWS_ENDPOINT_URL``, the keys), nothing in the config. The batches are the ones the same files
give from a local folder; a bucket with no Parquet file under the prefix is one line."""
import pyarrow.fs as pafs
import pytest

from distributed_runner.core.errors import ConfigError
from distributed_runner.data.loaders import build_dataloader
from tests.unit.test_streaming_data import write_shards

pytestmark = [pytest.mark.integration, pytest.mark.slow("moto's S3 server and a streamed run reading it"),
              pytest.mark.timeout(120)]


def batches(paths, **dataset):
    spec = dict(type="StreamingLoader", batch_size=8, num_streams=4, shuffle_window=16,
                dataset=dict(type="ParquetShards", paths=paths, **dataset), rank=0, world_size=1)
    return [b["index"].tolist() for b in build_dataloader(spec, "train_dataloader", seed=1)]


def test_shards_in_s3_stream_as_the_same_files_do_from_a_folder(s3_server, tmp_path,
                                                                 monkeypatch):
    local = write_shards(tmp_path / "train", rows=300, files=3, row_group=20)
    fs = pafs.S3FileSystem(allow_bucket_creation=True, **s3_server)
    fs.create_dir("corpus")
    pafs.copy_files(str(local), "corpus/train", destination_filesystem=fs)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3_server['endpoint_override']}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    remote = batches("s3://corpus/train")
    assert remote == batches(str(local)) and len(remote) == 38  # 37 of 8, then the last 4
    assert sorted(i for batch in remote for i in batch) == list(range(300))
    glob = batches("s3://corpus/train/part-00[01].parquet")  # a glob picks files
    assert glob != remote and len(glob) < len(remote)
    with pytest.raises(ConfigError) as e:
        batches("s3://corpus/nothing-here")
    assert str(e.value) == ("train_dataloader.dataset.paths: no Parquet file in "
                            "s3://corpus/nothing-here (looked for *.parquet)")
