"""The fine-tuning page (docs/how-to/pretrained.md) as a user runs it: make the small Llama and
the byte corpus, train the LoRA config (a few iterations), export the run merged, and the page's
snippet loads the export with transformers and continues the prompt."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import docs_block, docs_commands

pytest.importorskip("peft")
ROOT = Path(__file__).resolve().parents[2]
SHORT = ["train_cfg.max_iters=4", "train_cfg.val_interval=4", "default_hooks.logger.interval=2",
         "default_hooks.checkpoint.interval=4", "val_dataloader.dataset.max_rows=32"]


@pytest.mark.slow("the page's train, export and load commands, as subprocesses")
def test_the_pages_commands_make_train_export_and_load(tmp_path):
    commands = docs_commands("pretrained-finetune")
    assert [c.split()[:2] for c in commands] == [
        ["python", "tools/make_tiny_llama.py"], ["python", "tools/make_byte_corpus.py"],
        ["drun", "train"], ["drun", "export"]]
    for name in ("configs", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    drun = shutil.which("drun") or sys.executable
    for command in commands:
        argv = shlex.split(command)
        if argv[0] == "python":
            argv[0] = sys.executable
        else:
            argv = ([drun] if drun != sys.executable else [drun, "-m", "distributed_runner.cli"]) \
                + argv[1:] + (["--cfg-options", *SHORT] if argv[1] == "train" else [])
        out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
    exported = tmp_path / "exported" / "llama_lora"
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert not list(exported.glob("adapter_*"))  # merged: a plain model
    out = subprocess.run([sys.executable, "-c", docs_block("pretrained-load")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("def __init__(self")
