"""StreamingLoader on Ray (configs/digits_cnn_streaming.py, cut down): 2 Ray Train workers each
read their own streams of the digits Parquet shards, stop at iteration 30, and the checkpoint of
iteration 20 resumes in one process with a fixed launcher of 2 workers (a cluster that came back
with one: data/world_change.py keeps the saved global batch): it continues at global batch 20 of
the order the seed fixes, and no sample trained before that checkpoint goes through its pipeline
again."""
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from distributed_runner import Config, Runner
from distributed_runner.data.loaders import build_dataloader
from distributed_runner.data.streaming.corpus import tokenize
from distributed_runner.launch.launcher import RayLauncher, normalize_launcher
from tests.docs_blocks import docs_commands

pytestmark = [pytest.mark.integration, pytest.mark.slow("streamed Parquet on Ray workers, stopped and resumed"),
              pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_commands_are_the_ones_tested_here():
    make, train = (shlex.split(c) for c in docs_commands("streaming"))
    assert make == ["python", "tools/digits_to_parquet.py"]
    assert train == ["drun", "train", "configs/digits_cnn_streaming.py"]


def digits_with_index(folder: Path) -> Path:
    """The tool's digits shards, with an ``index`` column (the row's number) to follow samples."""
    out = subprocess.run([sys.executable, str(ROOT / "tools/digits_to_parquet.py"), str(folder)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first = 0
    for path in sorted((folder / "train").glob("*.parquet")):
        table = pq.read_table(path)
        index = pc.add(pa.array(range(len(table)), pa.int64()), first)
        pq.write_table(table.append_column("index", index), path, row_group_size=128)
        first += len(table)
    return folder / "train"


def config(work_dir: Path, data: Path, log: Path, **extra) -> Config:
    cfg = Config.fromfile(ROOT / "configs/digits_cnn_streaming.py")
    cfg["work_dir"] = str(work_dir)
    cfg["run_name"] = "."  # the test's folder is the run's
    cfg["custom_imports"] = dict(imports=["distributed_runner.examples.digits",
                                          "tests.stream_probe"])
    cfg["train_dataloader"]["dataset"]["paths"] = str(data)
    cfg["train_dataloader"]["num_workers"] = 1
    cfg["train_dataloader"]["pipeline"] = [dict(type="RecordAndDropIndex", path=str(log))]
    cfg["train_cfg"] = dict(by_epoch=False, max_iters=30, val_interval=1000)
    cfg["param_scheduler"] = None
    cfg["default_hooks"]["checkpoint"] = dict(type="CheckpointHook", interval=10,
                                              by_epoch=False)
    cfg["log_level"] = "WARNING"
    cfg.update(extra)
    return cfg


def recorded(log: Path) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines()]


def global_batches(data: Path) -> list[list[int]]:
    """The epoch's global batches of 32, as one process reads them (no pipeline)."""
    spec = dict(type="StreamingLoader", batch_size=32, num_streams=32, shuffle_window=64,
                dataset=dict(type="ParquetShards", paths=str(data)), rank=0, world_size=1)
    return [b["index"].tolist() for b in build_dataloader(spec, "train_dataloader", seed=0)]


def test_two_workers_stop_and_one_process_resumes_at_the_first_untrained_batch(
        ray_cluster, tmp_path):
    data = digits_with_index(tmp_path / "digits")
    on_ray, alone = tmp_path / "ray.txt", tmp_path / "alone.txt"
    cfg = config(tmp_path / "wd", data, on_ray)
    metrics = RayLauncher(cfg, normalize_launcher(cfg["launcher"])).fit().metrics
    assert metrics["iter"] == 30
    # the driver read the footers once; the workers were given its index (data/streaming/index.py)
    index = tmp_path / "wd" / "ray_storage" / "wd" / "data_index" / "train_dataloader.arrow"
    assert index.is_file()
    order = global_batches(data)
    # 32 streams of 44 or 45 rows: 44 global batches of 32, then the epoch's last rows
    assert [len(b) for b in order[:44]] == [32] * 44 and 0 < len(order[44]) < 32
    assert len(order) == 45
    pids = {line.split()[0] for line in on_ray.read_text().splitlines()}
    assert len(pids) == 2  # one loader worker process in each Ray worker
    ray_samples = recorded(on_ray)
    assert len(ray_samples) == len(set(ray_samples))  # each sample read by one worker, once
    assert {i for batch in order[:30] for i in batch} <= set(ray_samples)

    resumed = Runner.from_cfg(config(tmp_path / "alone", data, alone,
                                     resume=str(tmp_path / "wd" / "iter_20.pth"),
                                     launcher=dict(type="ray", num_workers=2)))
    resumed.train()
    plan = resumed.elastic_plan  # the saved global batch of 32 as 2 micro-batches of 16
    assert resumed.iter == 30 and (plan.kept_from, plan.micro_batches) == (2, 2)
    again = set(recorded(alone))
    assert not again & {i for batch in order[:20] for i in batch}  # nothing trained re-read
    assert {i for batch in order[20:30] for i in batch} <= again


def test_the_tokenize_tool_writes_shards_that_pack_back_into_the_documents(ray_cluster, tmp_path):
    """tools/tokenize_corpus.py on the session's Ray (Ray Data's map_batches): every document is
    one row of its UTF-8 bytes; packed with one unshuffled stream, the rows are the documents,
    each followed by the end token, in the shards' order."""
    texts = tmp_path / "texts"
    docs = {f"doc{i:02d}.txt": ("line %d\n" % i) * (i + 1) for i in range(30)}
    docs["sub/unicode.txt"] = "héllo wörld ✓\n"
    for name, text in docs.items():
        (texts / name).parent.mkdir(parents=True, exist_ok=True)
        (texts / name).write_text(text, encoding="utf-8")
    out = tmp_path / "tokens"
    assert tokenize(str(texts), str(out), rows_per_group=8) == len(docs)
    table = pq.read_table(out)
    written = {Path(p).relative_to(texts).as_posix(): bytes(t) for p, t in
               zip(table.column("path").to_pylist(), table.column("tokens").to_pylist(),
                   strict=True)}
    assert written == {name: text.encode() for name, text in docs.items()}
    spec = dict(type="StreamingLoader", batch_size=1, num_streams=1, shuffle=False,
                dataset=dict(type="ParquetShards", paths=str(out), columns=["tokens"]),
                pack=dict(column="tokens", seq_len=16, eos_token_id=0), rank=0, world_size=1)
    rows = [r for b in build_dataloader(spec, "train_dataloader", seed=0)
            for r in b["input_ids"].tolist()]
    files = sorted(out.glob("*.parquet"))
    ordered = [t for f in files for t in pq.read_table(f).column("tokens").to_pylist()]
    stream = [token for doc in ordered for token in doc + [0]]
    assert [t for r in rows for t in r] == stream[: len(stream) // 16 * 16]
