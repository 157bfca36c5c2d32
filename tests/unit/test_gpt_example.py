"""The language-model example: tools/make_byte_corpus.py splits and shards a corpus
deterministically, ByteShards reads it back as the model's keyword arguments, and the docs' two
commands (docs/how-to/gpt-example.md: make the corpus; train) run as written — shortened to a few
iterations."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from distributed_runner.core.errors import ConfigError
from distributed_runner.examples.lm import ByteShards
from tests.docs_blocks import docs_block, docs_commands

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_byte_corpus  # noqa: E402

# the docs' commands, cut down: a handful of iterations and a small validation set
SHORT = ["train_cfg.max_iters=4", "train_cfg.val_interval=4", "default_hooks.logger.interval=2",
         "val_dataloader.dataset.max_rows=32", "test_dataloader.dataset.max_rows=32"]


def tiny_source(root: Path) -> Path:
    """A few small .py files, plus two that must be left out (an installed package, a test)."""
    src = root / "src"
    for i in range(12):
        path = src / ("pkg" if i % 3 else "") / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""Module {i}."""\n' + f"def f{i}(x):\n    return x * {i}\n" * (i + 2))
    for skipped in ("site-packages/numpy_like.py", "test/test_mod.py"):
        (src / skipped).parent.mkdir(parents=True, exist_ok=True)
        (src / skipped).write_text("SKIPPED = True\n")
    return src


def read_rows(folder: Path) -> np.ndarray:
    tables = [pq.read_table(p) for p in sorted(folder.glob("*.parquet"))]
    for t in tables:
        assert t.column("input_ids").equals(t.column("labels"))
    rows = [np.stack(t.column("input_ids").to_pylist()) for t in tables]
    return np.concatenate(rows).astype(np.uint8)


def test_tool_splits_by_path_and_shards_every_block(tmp_path):
    src = tiny_source(tmp_path)
    meta = make_byte_corpus.build(tmp_path / "out", src, block_size=16, val_percent=30,
                                  rows_per_shard=5)
    files = make_byte_corpus.source_files(src)
    assert len(files) == 12 and not any("SKIPPED" in p.read_text() for p in files)
    for split in ("train", "val"):
        members = [p for p in files if make_byte_corpus.is_val(
            p.relative_to(src).as_posix(), 30) == (split == "val")]
        assert meta["files"][split] == len(members) > 0
        stream = b"".join(p.read_bytes() + b"\0" for p in members)
        rows = read_rows(tmp_path / "out" / split)
        assert rows.shape == (len(stream) // 16, 16) == (meta["rows"][split], 16)
        expected = np.frombuffer(stream[:rows.size], np.uint8).reshape(-1, 16)
        # shuffled, but every block of the stream exactly once
        assert sorted(map(bytes, rows)) == sorted(map(bytes, expected))
        assert len(list((tmp_path / "out" / split).glob("*.parquet"))) == -(-len(rows) // 5)
    again = make_byte_corpus.build(tmp_path / "again", src, block_size=16, val_percent=30,
                                   rows_per_shard=5)
    assert again["rows"] == meta["rows"]
    assert np.array_equal(read_rows(tmp_path / "again" / "train"),
                          read_rows(tmp_path / "out" / "train"))


def test_byte_shards_yield_the_models_arguments(tmp_path):
    make_byte_corpus.build(tmp_path / "out", tiny_source(tmp_path), block_size=16,
                           val_percent=30, rows_per_shard=5)
    data = ByteShards(str(tmp_path / "out"), split="train", block_size=16)
    item = data[0]
    assert set(item) == {"input_ids", "labels"}
    assert item["input_ids"].dtype == torch.long and item["input_ids"].shape == (16,)
    assert torch.equal(item["input_ids"], item["labels"])
    assert bytes(item["input_ids"].tolist()) == bytes(read_rows(tmp_path / "out" / "train")[0])
    assert len(ByteShards(str(tmp_path / "out"), split="train", max_rows=3)) == 3
    assert data.meta()["block_size"] == 16


@pytest.mark.parametrize("args,fragment", [
    (dict(data_root="nowhere"),
     "data_root: no shards in nowhere/train: run python tools/make_byte_corpus.py first"),
    (dict(block_size=32), "block_size: 32, but the corpus in"),
    (dict(split="test"), "split: got 'test'"),
])
def test_byte_shards_mistakes_are_one_line(tmp_path, args, fragment):
    make_byte_corpus.build(tmp_path / "out", tiny_source(tmp_path), block_size=16,
                           val_percent=30)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        ByteShards(**{"data_root": str(tmp_path / "out"), **args})


def readme_commands() -> list[str]:
    """The page's first bash block: the two commands, comments dropped."""
    return docs_commands("gpt-train")


@pytest.mark.slow("the GPT example's README commands, as subprocesses")
def test_readme_commands_make_the_corpus_and_train(tmp_path):
    commands = readme_commands()
    assert [c.split()[:2] for c in commands] == [["python", "tools/make_byte_corpus.py"],
                                                 ["drun", "train"]]
    for name in ("configs", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    drun = shutil.which("drun")
    for command in commands:
        argv = shlex.split(command)
        if argv[0] == "python":
            argv[0] = sys.executable
        else:
            argv = ([drun] if drun else [sys.executable, "-m", "distributed_runner.cli"]) \
                + argv[1:] + ["--cfg-options", *SHORT]
        out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
    (log_file,) = (tmp_path / "work_dirs" / "gpt_bytes").glob("*/logs/run.log")  # its run
    log = log_file.read_text()
    assert re.search(r"perplexity: \d", log), log[-2000:]
    assert (log_file.parent.parent / "last.pth").is_file()
    # the page's snippet continues a prompt with the weights just trained
    out = subprocess.run([sys.executable, "-c", docs_block("gpt-complete")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "def __init__(self" in out.stdout
    # the streamed variant (configs/gpt_bytes_streaming.py) trains on the same shards
    argv = ([drun] if drun else [sys.executable, "-m", "distributed_runner.cli"]) + [
        "train", "configs/gpt_bytes_streaming.py", "--cfg-options", *SHORT]
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    (log_file,) = (tmp_path / "work_dirs" / "gpt_bytes_streaming").glob("*/logs/run.log")
    log = log_file.read_text()
    assert re.search(r"perplexity: \d", log), log[-2000:]
