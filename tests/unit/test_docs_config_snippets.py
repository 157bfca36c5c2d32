"""The config snippets of the docs are valid configs.

Each statement of a snippet (``default_hooks = dict(...)``) sets its key in the digits example's
config, and the result goes through the checks ``drun train --launcher ray`` makes on its driver
before any worker starts (``launcher.validate_config``: every ``type`` resolved, every argument
matched against its constructor, the hooks planned and their sinks checked) — without building a
model or training. A snippet that assigns the same key twice shows alternatives: each is checked
on its own.
"""
from __future__ import annotations

import ast
import sys

import pytest

from tests.docs_blocks import ROOT, docs_block

SNIPPETS = ("override-defaults", "timer-options", "sinks-config", "ray-data-loader",
            "streaming-loader", "streaming-pack",            "fsdp-strategy", "activation-checkpointing", "hf-gpt2-model", "classifier-timm",
            "compile-config", "watchdog-config",
            "async-val-config", "tp-strategy", "straggler-config")
NEEDS = {"classifier-timm": "timm", "hf-gpt2-model": "transformers", "tp-strategy": "transformers"}
# the example whose model has the classes a snippet names (else the digits example)
BASE = {"fsdp-strategy": "gpt_bytes.py", "activation-checkpointing": "gpt_bytes.py"}
LLAMA = dict(type="transformers.LlamaForCausalLM", config=dict(
    type="transformers.LlamaConfig", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=256))


def alternatives(code: str) -> list[dict]:
    """The snippet's assignments, grouped: a key assigned again starts another alternative."""
    groups: list[dict] = [{}]
    for statement in ast.parse(code).body:
        namespace: dict = {}
        exec(compile(ast.Module([statement], []), "<docs>", "exec"), namespace)
        values = {k: v for k, v in namespace.items() if not k.startswith("__")}
        if set(values) & set(groups[-1]):
            groups.append({})
        groups[-1].update(values)
    return groups


REMOTE_CORPUS = "s3://corpus/tokens"  # streaming-pack's; test_streaming_s3 reads it from moto


@pytest.fixture(scope="module")
def data_folder(tmp_path_factory):
    """Where the streaming snippets' relative paths lead: the digits as Parquet (the README's
    tools/digits_to_parquet.py), and a token corpus standing in for the bucket."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, str(ROOT / "tools"))
    import digits_to_parquet

    root = tmp_path_factory.mktemp("snippets")
    digits_to_parquet.main(str(root / "data" / "digits_parquet"))
    (root / "tokens").mkdir()
    docs = [list(range(i, i + 900)) for i in range(40)]
    pq.write_table(pa.table({"tokens": docs}), root / "tokens" / "part-0.parquet",
                   row_group_size=4)
    return root


@pytest.mark.parametrize("name", SNIPPETS)
def test_config_snippet_is_a_valid_config(name, tmp_path, data_folder, monkeypatch):
    from distributed_runner import Config
    from distributed_runner.core.registry import check_arguments
    from distributed_runner.launch.launcher import validate_config

    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    monkeypatch.chdir(data_folder)  # the driver reads the streamed files' footers
    code = docs_block(name).replace(REMOTE_CORPUS, str(data_folder / "tokens"))
    groups = alternatives(code)
    assert groups and groups[0]
    for values in groups:
        cfg = Config.fromfile(ROOT / "configs" / BASE.get(name, "digits_cnn.py"),
                              cfg_options=[f"work_dir={tmp_path}"])
        if name == "tp-strategy":
            cfg["model"] = LLAMA
        cfg.update(values)
        plan = validate_config({**cfg, "launcher": dict(type="ray", num_workers=2)})
        assert "built on the meta device" in plan.lines["model"][0], plan.lines["model"]
        loader = cfg.get("train_dataloader")
        if isinstance(loader, dict) and loader.get("type") == "RayDataLoader":
            from distributed_runner.data.ray_data import RayDataLoader
            check_arguments(RayDataLoader, {k: v for k, v in loader.items() if k != "type"},
                            "train_dataloader")


def test_the_ray_data_snippet_is_the_configs_loader():
    from distributed_runner import Config

    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn_raydata.py")
    (snippet,) = alternatives(docs_block("ray-data-loader"))
    assert snippet["train_dataloader"] == dict(cfg["train_dataloader"])


def test_the_streaming_snippet_is_the_configs_loader():
    from distributed_runner import Config

    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn_streaming.py")
    (snippet,) = alternatives(docs_block("streaming-loader"))
    assert snippet["train_dataloader"] == dict(cfg["train_dataloader"])


def test_alternatives_split_where_a_key_comes_again():
    code = "a = 1\nb = 2\na = 3\n"
    assert alternatives(code) == [{"a": 1, "b": 2}, {"a": 3}]
