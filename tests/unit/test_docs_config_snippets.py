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

import pytest

from tests.docs_blocks import ROOT, docs_block

SNIPPETS = ("override-defaults", "timer-options", "sinks-config", "ray-data-loader",
            "streaming-loader", "streaming-pack",            "fsdp-strategy", "activation-checkpointing", "hf-gpt2-model", "classifier-timm",
            "compile-config", "watchdog-config",
            "async-val-config")
NEEDS = {"classifier-timm": "timm", "hf-gpt2-model": "transformers"}


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


@pytest.mark.parametrize("name", SNIPPETS)
def test_config_snippet_is_a_valid_config(name, tmp_path):
    from distributed_runner import Config
    from distributed_runner.core.registry import check_arguments
    from distributed_runner.launch.launcher import validate_config

    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    groups = alternatives(docs_block(name))
    assert groups and groups[0]
    for values in groups:
        cfg = Config.fromfile(ROOT / "configs" / "digits_cnn.py",
                              cfg_options=[f"work_dir={tmp_path}"])
        cfg.update(values)
        validate_config(cfg)
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
