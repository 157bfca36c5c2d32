"""Which tensor of the model is which name in a Hugging Face directory.

The model's ``state_dict`` names are the files' names, as ``save_pretrained`` writes them, up to
three differences, each undone here as ``from_pretrained`` (or PEFT) would:

* PEFT wraps the model: ``base_model.model.`` in front, the wrapped layer's own weight under
  ``.base_layer`` (LoRA) or ``.original_module`` / ``.modules_to_save.<adapter>`` (a module
  trained whole); the adapters themselves (``lora_A`` ...) are in no base file.
* The base-model prefix (``model.`` for Llama): a ``LlamaModel``'s files lack it when loaded
  into a ``LlamaForCausalLM``, and the other way round.
* Tied weights (``lm_head.weight`` *is* ``model.embed_tokens.weight``) are one tensor under two
  names, stored once: loading either name fills both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

PEFT_ROOT = "base_model.model."
ADAPTER_PARTS = frozenset(
    {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"}
)


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is PEFT's wrapper (``get_peft_model``'s result)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_name(key: str, peft: bool) -> str | None:
    """The name of ``key``'s tensor in the base model's files; None for an adapter's own
    tensor, which no base file holds."""
    if not peft:
        return key
    name = key[len(PEFT_ROOT) :] if key.startswith(PEFT_ROOT) else key
    parts = name.split(".")
    if ADAPTER_PARTS.intersection(parts):
        return None
    out: list[str] = []
    skip_next = False
    for part in parts:
        if skip_next:  # the adapter's name after modules_to_save
            skip_next = False
        elif part == "modules_to_save":
            skip_next = True
        elif part not in ("base_layer", "original_module"):
            out.append(part)
    return ".".join(out)


def hf_model_of(model: nn.Module) -> Any:
    """The ``transformers`` model inside ``model`` (itself, or under PEFT), or None."""
    inner = model.get_base_model() if is_peft_model(model) else model  # type: ignore[operator]
    return inner if hasattr(inner, "base_model_prefix") and hasattr(inner, "config") else None


@dataclass
class NameMap:
    """The model's tensors grouped by identity (tied names together), each group with the
    file name it loads from (None: in no file)."""

    groups: list[tuple[list[str], str | None]] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def loaded(self) -> dict[str, str]:
        """One model name per group that a file fills -> its file name."""
        return {names[0]: file for names, file in self.groups if file is not None}

    def missing(self) -> list[str]:
        return [names[0] for names, file in self.groups if file is None]


def map_names(model: nn.Module, file_names: set[str]) -> NameMap:
    """The :class:`NameMap` of ``model`` (built, possibly on the meta device, not yet sharded)
    against the tensor names a directory holds."""
    peft = is_peft_model(model)
    hf = hf_model_of(model)
    prefix = getattr(hf, "base_model_prefix", "") or ""
    by_tensor: dict[int, list[str]] = {}
    result = NameMap()
    for key, tensor in model.state_dict(keep_vars=True).items():
        result.shapes[key] = tuple(tensor.shape)
        by_tensor.setdefault(id(tensor), []).append(key)
    shift = _prefix_shift(prefix, by_tensor, file_names, peft)
    for names in by_tensor.values():
        bases = [base_name(k, peft) for k in names]
        if all(b is None for b in bases):  # an adapter's own tensor: in no base file
            continue
        candidates = [shift(b) for b in bases if b is not None]
        found = next((c for c in candidates if c in file_names), None)
        result.groups.append((names, found))
    return result


def _prefix_shift(prefix: str, by_tensor: dict, file_names: set[str], peft: bool) -> Any:
    """How a model name becomes a file name: as it is, or with the base-model prefix added or
    dropped when the files and the model disagree on it (from_pretrained's rule)."""
    if not prefix:
        return lambda name: name
    lead = f"{prefix}."
    model_names = [base_name(k, peft) or "" for names in by_tensor.values() for k in names]
    model_has = any(n.startswith(lead) for n in model_names)
    files_have = any(n.startswith(lead) for n in file_names)
    if model_has and not files_have:
        return lambda name: name[len(lead) :] if name.startswith(lead) else name
    if files_have and not model_has:
        return lambda name: lead + name
    return lambda name: name


def ignored(patterns: Any, name: str) -> bool:
    """Whether ``name`` matches one of a model's ``_keys_to_ignore_on_load_*`` patterns."""
    return any(re.search(p, name) for p in patterns or ())
