"""Remote storage as one core concern (review of 4223738, polish items 2 and 3):
:mod:`distributed_runner.core.storage` says which paths are URIs and opens them, with one-line
errors naming the key of whoever asked; ``HFModel`` is a model (``distributed_runner.model``), a
built-in of ``MODELS`` that resolves without the checkpoint code (the Ray driver imports none).
``file://`` URIs stand in for object storage: pyarrow opens them as it opens ``s3://``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distributed_runner.core.errors import ArgumentError, ConfigError
from distributed_runner.core.registry import DATASETS, MODELS
from distributed_runner.core.storage import is_remote, open_filesystem

ROOT = Path(__file__).resolve().parents[2]


def test_a_uri_is_remote_and_a_path_is_not():
    assert is_remote("s3://bucket/run") and is_remote("file:///tmp/x")
    assert not is_remote("/shared/run") and not is_remote(Path("relative/run"))


def test_open_filesystem_names_the_keys_its_caller_gives(tmp_path):
    fs, root = open_filesystem(f"file://{tmp_path}/", key="out_dir")
    assert root == str(tmp_path) and fs.get_file_info(root).is_file is False
    with pytest.raises(ArgumentError, match=r"^filesystem: options are supported for s3:// "
                                            r"only; file:// takes its configuration from the "
                                            r"environment$"):
        open_filesystem(f"file://{tmp_path}", dict(region="x"), key="paths",
                        options_key="filesystem")
    with pytest.raises(ArgumentError, match=r"^backend_args: pyarrow.fs.S3FileSystem rejected "
                                            r"them: "):
        open_filesystem("s3://bucket/run", dict(endpoint_overide="x"), key="out_dir")
    with pytest.raises(ArgumentError, match=r"^out_dir: cannot open nosuch://user:\*+@host/x: "):
        open_filesystem("nosuch://user:secret@host/x", key="out_dir")


def test_parquet_shards_name_their_own_keys():
    with pytest.raises(ConfigError, match=r"^train_dataloader.dataset.filesystem: pyarrow.fs."
                                          r"S3FileSystem rejected them: "):
        DATASETS.build(dict(type="ParquetShards", paths="s3://bucket/shards",
                            filesystem=dict(bogus=1)), "train_dataloader.dataset")
    with pytest.raises(ConfigError, match=r"^train_dataloader.dataset.paths: cannot open "):
        DATASETS.build(dict(type="ParquetShards", paths="nosuch://bucket/shards"),
                       "train_dataloader.dataset")


def test_hf_model_resolves_in_a_fresh_process_without_the_checkpoint_code():
    code = (
        "import sys\n"
        "from distributed_runner.core.registry import MODELS\n"
        "f = MODELS.resolve('HFModel', 'model')\n"
        "assert f.__module__ == 'distributed_runner.model.hf_model', f.__module__\n"
        "loaded = [m for m in sys.modules if m.startswith('distributed_runner.checkpoint')]\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.fixture
def config_dir(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16,
                            n_positions=8).save_pretrained(folder)
    return folder


def test_hf_model_builds_from_a_local_or_remote_directorys_config(config_dir):
    local = MODELS.build(dict(type="HFModel", path=str(config_dir), n_layer=2), "model")
    assert type(local).__name__ == "GPT2LMHeadModel" and local.config.n_layer == 2
    uri = f"file://{config_dir}"
    remote = MODELS.build(dict(type="HFModel", path=uri,
                               auto_class="AutoModelForSequenceClassification", num_labels=3),
                          "model")
    assert type(remote).__name__ == "GPT2ForSequenceClassification"
    assert remote.config.num_labels == 3 and remote.config.name_or_path == uri


def test_hf_model_mistakes_are_one_line_naming_model_path(tmp_path, config_dir):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=rf"^model.path: {tmp_path}/empty has no config.json: "
                                          r"is it a Hugging Face model directory\?$"):
        MODELS.build(dict(type="HFModel", path=str(tmp_path / "empty")), "model")
    with pytest.raises(ConfigError, match=rf"^model.path: file://{tmp_path}/empty has no "
                                          r"config.json: "):
        MODELS.build(dict(type="HFModel", path=f"file://{tmp_path}/empty"), "model")
    with pytest.raises(ConfigError, match=rf"^model.path: file://{tmp_path}/nothing does not "
                                          r"exist: check the path$"):
        MODELS.build(dict(type="HFModel", path=f"file://{tmp_path}/nothing"), "model")
    with pytest.raises(ConfigError, match=r"^model.backend_args: options are supported for s3:// "
                                          r"only"):
        MODELS.build(dict(type="HFModel", path=f"file://{config_dir}",
                          backend_args=dict(region="x")), "model")
    with pytest.raises(ConfigError, match=r"^model.auto_class: got 'AutoThing'; takes one of "):
        MODELS.build(dict(type="HFModel", path=str(config_dir), auto_class="AutoThing"), "model")
