"""``drun export CHECKPOINT OUT_DIR --format hf``: a checkpoint as the directory
``from_pretrained`` (vLLM, the Hub) reads — ``config.json``, safetensors shards with their
index, and the tokenizer files that sat beside the weights ``load_from`` named.

Never the whole model in one process: the model is built from the checkpoint's own config with
its parameters on the meta device (names, shapes, tied weights, PEFT's layers — no weights),
and tensors are read a shard of output at a time — from a one-file checkpoint mapped into
memory (``torch.load(mmap=True)``), from a sharded one through DCP, which assembles each
tensor from the ranks' files whatever the world size that wrote them.

Under PEFT, ``merge_adapters`` folds each LoRA adapter into its base weight (a plain model
out); without it the adapters are written as PEFT's ``save_pretrained`` writes them
(``adapter_config.json``, ``adapter_model.safetensors``), the base being ``load_from``'s.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distributed_runner.checkpoint.files import load_file, model_state_from
from distributed_runner.checkpoint.hf.directory import (
    INDEX,
    SIDE_FILES,
    SINGLE,
    is_pretrained_dir,
    local_directory,
    pretrained_source,
    tensor_index,
)
from distributed_runner.checkpoint.hf.names import base_name, hf_model_of, is_peft_model, map_names
from distributed_runner.checkpoint.hf.peft_layers import check_supported, lora_layers, merge_delta
from distributed_runner.checkpoint.parts import frozen_names
from distributed_runner.checkpoint.resume_choice import checkpoint_file_of, parse_load_from
from distributed_runner.checkpoint.sharded import SHARDED, TRAINABLE
from distributed_runner.core.config import import_custom_modules
from distributed_runner.core.errors import ConfigError
from distributed_runner.model.build import build_unmoved
from distributed_runner.model.empty_init import parameters_on_meta

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KEY = "CHECKPOINT"


def parse_size(text: str) -> int:
    """``--max-shard-size`` in bytes, as transformers reads it: ``5GB`` is 5 * 10**9, ``5GiB``
    5 * 2**30; ``500MB``, ``200KB`` or a plain number of bytes."""
    units = {
        "GIB": 1 << 30,
        "MIB": 1 << 20,
        "KIB": 1 << 10,
        "GB": 10**9,
        "MB": 10**6,
        "KB": 10**3,
        "B": 1,
    }
    word = text.strip().upper()
    for unit, factor in units.items():
        number = word[: -len(unit)].strip()
        if word.endswith(unit) and number.replace(".", "", 1).isdigit() and float(number) > 0:
            return int(float(number) * factor)
    if word.isdigit() and int(word) > 0:
        return int(word)
    raise ConfigError("--max-shard-size", f"got {text!r}; takes e.g. 5GB, 500MB or 200KB")


@dataclass
class Planned:
    """One output tensor: its name in the files, the checkpoint names it is made of, and how."""

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    lora: list[tuple[Any, str, str, str]]  # (layer, adapter, A's name, B's name) to merge in


def export_hf(
    checkpoint: str | Path,
    out_dir: str | Path,
    dtype: str | None = None,
    merge_adapters: bool = False,
    max_shard_bytes: int = 5 * 10**9,
    cfg: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``checkpoint`` (a file, a run's folder, a sharded checkpoint's ``.dcp`` folder or
    Ray's copy: :func:`~distributed_runner.checkpoint.resume_choice.checkpoint_file_of`) to
    ``out_dir`` as a Hugging Face model directory; returns it. ``cfg``: the config to build the
    model from (default: the checkpoint's own). Written beside ``out_dir`` first and moved into
    place, so a failed export leaves no half directory and never mixes with an older export."""
    path, out = checkpoint_file_of(checkpoint, KEY), Path(out_dir).expanduser()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(
            "OUT_DIR", f"{out} is not empty: choose another, or pass --overwrite to replace it"
        )
    ckpt = load_file(path, KEY, mmap=True)
    cfg = cfg if cfg is not None else json.loads(ckpt.get("meta", {}).get("config", "{}"))
    model = _empty_model(cfg, path)
    hf = hf_model_of(model)
    if hf is None:
        raise ConfigError(
            "model",
            "is not a transformers model: --format hf needs one "
            "(a PreTrainedModel, or one under PEFT)",
        )
    cast = DTYPES[dtype] if dtype else None
    source = _pretrained_of(ckpt, cfg)
    read = _reader(path, ckpt)
    if ckpt.get("meta", {}).get("weights") == TRAINABLE:  # the frozen base: load_from's files
        read = _with_base(read, model, source)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if is_peft_model(model) and not merge_adapters:
        _write_adapters(model, read, partial, cast, source)
    else:
        check_supported(model, "--merge-adapters", merging=True)
        _write_shards(_plan(model, cast), read, partial, max_shard_bytes)
        _write_config(hf, partial, cast)
    _copy_side_files(source, partial)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)
    return out


def _empty_model(cfg: dict, path: Path) -> nn.Module:
    """The config's model, its parameters on the meta device (names, shapes, ties; no data)."""
    if not cfg.get("model"):
        raise ConfigError(KEY, f"{path} holds no config to build its model from: pass --config")
    import_custom_modules(cfg.get("custom_imports"))
    with parameters_on_meta(), warnings.catch_warnings():
        # transformers' deprecation that PEFT's wrapping triggers; nothing a user can change
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        return build_unmoved(cfg["model"])


def _pretrained_of(ckpt: dict, cfg: dict) -> str | None:
    """The model directory the run started from: recorded in the checkpoint (absolute), else
    its config's ``load_from`` when that is one from here."""
    recorded = ckpt.get("meta", {}).get("pretrained_from")
    if recorded:
        return str(recorded)
    given, _ = parse_load_from(cfg.get("load_from"))
    return pretrained_source(given)


def _plan(model: nn.Module, cast: torch.dtype | None) -> list[Planned]:
    """The output tensors of a plain (or merged) model: one per tied group, under the base
    model's names; a layer's LoRA adapters to be merged into its base weight."""
    peft = is_peft_model(model)
    layers = lora_layers(model)
    chosen: dict[str, Planned] = {}
    seen: set[int] = set()  # a tied weight is one tensor: written once, under its first name
    for key, tensor in model.state_dict(keep_vars=True).items():
        name = base_name(key, peft)
        if name is None or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if name in chosen and "modules_to_save" not in key:
            continue  # PEFT's original_module: its trained copy (modules_to_save) wins
        # the adapters change a layer's weight only (PEFT merges no bias; lora_bias is refused)
        layer_name = key.rsplit(".", 2)[0] if key.endswith(".base_layer.weight") else None
        merges = _merges(layers.get(layer_name), layer_name) if layer_name else []
        out_dtype = cast if cast is not None and tensor.is_floating_point() else tensor.dtype
        chosen[name] = Planned(name, key, tuple(tensor.shape), out_dtype, merges)
    return sorted(chosen.values(), key=lambda p: p.name)


def _merges(layer: Any, layer_name: str) -> list[tuple[Any, str, str, str]]:
    if layer is None:
        return []
    merges = []
    for adapter in layer.lora_A:
        merges.append(
            (
                layer,
                adapter,
                f"{layer_name}.lora_A.{adapter}.weight",
                f"{layer_name}.lora_B.{adapter}.weight",
            )
        )
    for adapter in layer.lora_embedding_A:
        merges.append(
            (
                layer,
                adapter,
                f"{layer_name}.lora_embedding_A.{adapter}",
                f"{layer_name}.lora_embedding_B.{adapter}",
            )
        )
    return merges


def _shards(plan: list[Planned], limit: int) -> list[list[Planned]]:
    shards: list[list[Planned]] = [[]]
    size = 0
    for item in plan:
        nbytes = math.prod(item.shape) * torch.empty((), dtype=item.dtype).element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += nbytes
    return shards


def _write_shards(plan: list[Planned], read: Callable, out: Path, limit: int) -> None:
    """The safetensors files (one output shard in memory at a time) and, with several,
    their index."""
    from safetensors.torch import save_file

    shards = _shards(plan, limit)
    weight_map: dict[str, str] = {}
    total = 0
    for number, shard in enumerate(shards, start=1):
        name = (
            SINGLE if len(shards) == 1 else f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        )
        tensors = dict(_tensors(shard, read))
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, name))
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _tensors(shard: list[Planned], read: Callable) -> Iterator[tuple[str, torch.Tensor]]:
    names = [p.source for p in shard] + [n for p in shard for _, _, a, b in p.lora for n in (a, b)]
    values = read(names)
    for item in shard:
        tensor = values[item.source]
        if item.lora:
            tensor = tensor.float()
            for layer, adapter, a, b in item.lora:
                tensor = tensor + merge_delta(layer, adapter, {"A": values[a], "B": values[b]})
        yield item.name, tensor.to(item.dtype).contiguous()


def _reader(path: Path, ckpt: dict) -> Callable[[list[str]], dict[str, torch.Tensor]]:
    """A function reading the named model tensors: from the (memory-mapped) file, or, for a
    sharded checkpoint, from its DCP folder (resharded to one process)."""
    if SHARDED not in ckpt:
        state = model_state_from(ckpt)

        def from_file(names: list[str]) -> dict[str, torch.Tensor]:
            missing = [n for n in names if n not in state]
            if missing:
                raise ConfigError(
                    KEY,
                    f"{path} has no tensor {missing[0]}: is it a checkpoint "
                    f"of this config's model? (pass --config)",
                )
            return {n: state[n] for n in names}

        return from_file
    return _shard_reader(path, ckpt)


def _with_base(read: Callable, model: nn.Module, source: str | None) -> Callable:
    """``read``, falling back for the weights a trainable-only checkpoint left out to the model
    directory the run loaded them from."""
    from safetensors import safe_open

    if not source or not is_pretrained_dir(source):
        raise ConfigError(
            KEY,
            f"holds the trainable weights only, and the model directory "
            f"they were trained on ({source}) is not there to take the rest "
            f"from: pass --config with load_from naming it",
        )
    folder = local_directory(source)
    index = tensor_index(folder)
    names = map_names(model, set(index))
    file_of = {key: file for keys, file in names.groups if file for key in keys}
    frozen = frozen_names(model)

    def with_base(wanted: list[str]) -> dict[str, torch.Tensor]:
        values = read([n for n in wanted if n not in frozen])
        by_file: dict[Path, list[str]] = {}  # each safetensors file opened once per call
        for name in (n for n in wanted if n in frozen):
            if name not in file_of:
                raise ConfigError(
                    KEY, f"{name} is frozen, so not in the checkpoint, and not in {folder} either"
                )
            by_file.setdefault(index[file_of[name]].file, []).append(name)
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                values.update({name: f.get_tensor(file_of[name]) for name in names})
        return values

    return with_base


def _shard_reader(path: Path, ckpt: dict) -> Callable[[list[str]], dict[str, torch.Tensor]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    folder = str(path.parent / ckpt[SHARDED]["dir"])
    meta = FileSystemReader(folder).read_metadata().state_dict_metadata

    def from_shards(names: list[str]) -> dict[str, torch.Tensor]:
        wanted = {}
        for n in names:
            info = meta.get(f"model.{n}")
            if info is None:
                raise ConfigError(
                    KEY,
                    f"{path} has no tensor {n} in its shards: is it a "
                    f"checkpoint of this config's model? (pass --config)",
                )
            wanted[n] = torch.empty(info.size, dtype=info.properties.dtype)  # type: ignore[union-attr]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load({"model": wanted}, checkpoint_id=folder, no_dist=True)
        return wanted

    return from_shards


def _write_config(hf: Any, out: Path, cast: torch.dtype | None) -> None:
    config = hf.config
    if cast is not None:
        config.torch_dtype = cast
    config.save_pretrained(str(out))
    generation = getattr(hf, "generation_config", None)
    if generation is not None and hf.can_generate():
        generation.save_pretrained(str(out))


def _write_adapters(
    model: nn.Module, read: Callable, out: Path, cast: torch.dtype | None, source: str | None
) -> None:
    """PEFT's own layout: the trained adapter tensors under PEFT's saved names, and the
    adapters' config naming the base (``load_from``)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    peft_names = [
        k for k in model.state_dict() if base_name(k, True) is None or "modules_to_save" in k
    ]
    values = read(peft_names)
    configs: dict[str, Any] = getattr(model, "peft_config", {})
    for adapter, config in configs.items():
        state = get_peft_model_state_dict(model, state_dict=values, adapter_name=adapter)
        state = {
            k: (v.to(cast) if cast and v.is_floating_point() else v).contiguous()
            for k, v in state.items()
        }
        folder = out if adapter == "default" else out / adapter
        folder.mkdir(parents=True, exist_ok=True)
        save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        if source:
            config.base_model_name_or_path = source
        config.save_pretrained(str(folder))


def _copy_side_files(source: str | None, out: Path) -> None:
    """The tokenizer (and generation) files beside the weights the run started from."""
    if not source:
        return
    if not is_pretrained_dir(source):
        logging.getLogger(__name__).warning(
            "drun export: %s, where the run's weights came from, is not there: no tokenizer "
            "files copied",
            source,
        )
        return
    folder = local_directory(source)
    for name in SIDE_FILES:
        if (folder / name).is_file() and not (out / name).exists():
            shutil.copy2(folder / name, out / name)
