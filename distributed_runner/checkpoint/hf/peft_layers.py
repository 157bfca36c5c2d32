"""PEFT's LoRA layers where weights come from a model directory: adapters initialised as PEFT
initialises them (the model was built without weights), and merged into their base weights
on export (``W + scaling * B @ A``, PEFT's ``merge_and_unload``, one layer at a time)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from distributed_runner.core.errors import ConfigError
from distributed_runner.model.empty_init import materialize_module

ADAPTER_DICTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")
MERGEABLE = ("Linear", "Conv1D", "Embedding")


def lora_layers(model: nn.Module) -> dict[str, Any]:
    """Every LoRA layer of ``model`` by its module name (PEFT's ``LoraLayer``s)."""
    return {
        name: m
        for name, m in model.named_modules()
        if hasattr(m, "reset_lora_parameters") and hasattr(m, "lora_A")
    }


def check_supported(model: nn.Module, key: str, merging: bool = False) -> None:
    """What loading from a model directory (and merging) knows: LoRA on linear layers
    (transformers' ``Conv1D`` too) and embeddings, initialised from no base weight. DoRA and
    PiSSA-like initialisations (computed from the base weight), other PEFT methods and, for a
    merge, LoRA's own biases or a convolution are one line each."""
    for adapter, config in getattr(model, "peft_config", {}).items():
        kind = str(getattr(config, "peft_type", ""))
        if not kind.endswith("LORA") or kind.endswith("ADALORA"):
            raise ConfigError(
                key,
                f"adapter {adapter!r} is {kind}: with weights from a model "
                f"directory only LoRA (peft.LoraConfig) is supported",
            )
        if getattr(config, "use_dora", False):
            raise ConfigError(
                key,
                f"adapter {adapter!r} uses DoRA (use_dora=True), which "
                f"loading from a model directory does not support",
            )
        init = getattr(config, "init_lora_weights", True)
        if init not in (True, False, "gaussian"):
            raise ConfigError(
                key,
                f"adapter {adapter!r}: init_lora_weights={init!r} is "
                f"computed from the base weights; with a model directory "
                f"use True, False or 'gaussian'",
            )
        if merging and getattr(config, "lora_bias", False):
            raise ConfigError(
                key,
                f"adapter {adapter!r} has lora_bias=True, which cannot be "
                f"merged (as in PEFT): export without --merge-adapters",
            )
    if merging:
        for name, layer in lora_layers(model).items():
            base = type(layer.get_base_layer()).__name__
            if base not in MERGEABLE:
                raise ConfigError(
                    key,
                    f"{name}: LoRA on a {base} cannot be merged here "
                    f"(Linear, Conv1D and Embedding can): export without "
                    f"--merge-adapters",
                )


def init_adapters(model: nn.Module) -> None:
    """Storage and PEFT's own initial values for every adapter of ``model``, built with its
    parameters on the meta device (LoRA's A random, B zero: the model starts as its base)."""
    configs = getattr(model, "peft_config", {})
    for layer in lora_layers(model).values():
        for adapter in [*layer.lora_A, *layer.lora_embedding_A]:
            for table in ADAPTER_DICTS:
                holder = getattr(layer, table, {})
                if adapter in holder:
                    _materialize_tree(holder[adapter])
            init = getattr(configs.get(adapter), "init_lora_weights", True)
            layer.reset_lora_parameters(adapter, init)


def _materialize_tree(item: Any) -> None:
    if isinstance(item, nn.Module):
        for module in item.modules():
            materialize_module(module, "cpu")
    elif isinstance(item, nn.Parameter) and item.device.type == "meta":
        item.data = torch.empty_like(item, device="cpu")


def merge_delta(layer: Any, adapter: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """``scaling * B @ A`` of ``adapter`` in ``layer``, shaped as the base weight (``tensors``:
    the adapter's ``A`` and ``B`` by those letters)."""
    scale = float(layer.scaling[adapter])
    a, b = tensors["A"].float(), tensors["B"].float()
    if adapter in getattr(layer, "lora_embedding_A", {}):
        return (b @ a).T * scale  # A: [r, num_embeddings], B: [dim, r]
    delta = (b @ a) * scale
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta
