"""``load_from=<a save_pretrained directory>``: pretrained weights into the model as built —
plain, DDP, FSDP, or under PEFT — with no rank holding the whole model when it is sharded.

The order, driven by :func:`distributed_runner.model.build.setup_model`::

    build the model, parameters on the meta device          (model/empty_init.py)
    prepare(model)   names checked against the files' headers: one line for a tensor that is
                     missing, unexpected or of another shape; tensors no file holds (LoRA's
                     adapters, a new head with strict=False) initialised, on the CPU, in full
    [fully_shard]    FSDP: each rank keeps its slices, still on the meta device
    materialize      storage for this rank's slices only
    load(model)      DCP with torch's Hugging Face storage reader: each rank reads from the
                     safetensors exactly the rows its slices hold, converting the dtype
    [DDP, compile]

Tensors are matched by name as ``from_pretrained`` matches them (checkpoint/hf/names.py).
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path

import torch
from torch import nn

from distributed_runner.checkpoint.hf.directory import local_directory, tensor_index
from distributed_runner.checkpoint.hf.names import NameMap, hf_model_of, ignored, map_names
from distributed_runner.checkpoint.hf.peft_layers import check_supported, init_adapters
from distributed_runner.core.errors import ConfigError
from distributed_runner.model.empty_init import materialize_module
from distributed_runner.model.sharding import is_sharded

KEY = "load_from"
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U8": 1}


class PretrainedWeights:
    """The weights of one model directory, for :func:`~distributed_runner.model.build.setup_model`
    (its ``WeightSource``)."""

    def __init__(
        self, path: str, strict: bool = True, seed: int = 0, logger: logging.Logger | None = None
    ) -> None:
        self.path = path
        self.strict = strict
        self.seed = seed
        self.logger = logger or logging.getLogger(__name__)
        self.folder: Path | None = None
        self.names: NameMap | None = None

    def prepare(self, model: nn.Module) -> None:
        """Check ``model``'s names and shapes against the files; give every tensor no file
        holds its initial value (the same on every rank: seeded here)."""
        self.folder = local_directory(self.path)
        index = tensor_index(self.folder)
        check_supported(model, KEY)
        self.names = map_names(model, set(index))
        self._check(model, {k: v.shape for k, v in index.items()})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            init_adapters(model)
            _init_missing(model, self.names.missing())

    def load(self, model: nn.Module) -> None:
        """Fill ``model`` (materialized, sharded or not) from the files: every rank calls it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

        assert self.names is not None and self.folder is not None, "prepare() first"
        state = _state_of(model)
        for targets in _passes(state, self.names.groups):  # a file name once per pass
            with warnings.catch_warnings():  # one process: DCP says it assumes so
                warnings.filterwarnings("ignore", "torch.distributed is disabled")
                dcp.load(targets, storage_reader=HuggingFaceStorageReader(str(self.folder)))
        self.logger.info("loaded %d tensors from %s", len(self.names.loaded()), self.path)

    def _check(self, model: nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
        assert self.names is not None
        hf = hf_model_of(model)
        for names, file in self.names.groups:
            if file is not None and tuple(shapes[file]) != self.names.shapes[names[0]]:
                raise ConfigError(
                    KEY,
                    f"{self.path}: {file} is {list(shapes[file])} in the "
                    f"files, {list(self.names.shapes[names[0]])} in the model "
                    f"({names[0]}): is it this model's directory?",
                )
        missing = _reported(self.names.missing(), hf, "_keys_to_ignore_on_load_missing")
        if missing and self.strict:
            raise ConfigError(
                KEY,
                f"{self.path} has no tensor for {_first(missing)}: is it "
                f"this model's directory? (load_from=dict(path=..., "
                f"strict=False) initialises what the files lack, e.g. a "
                f"new head)",
            )
        used = set(self.names.loaded().values())
        unexpected = _reported(
            [n for n in shapes if n not in used], hf, "_keys_to_ignore_on_load_unexpected"
        )
        if unexpected and self.strict:
            raise ConfigError(
                KEY,
                f"{self.path} holds {_first(unexpected)}, which the model "
                f"has no place for: is it this model's directory? "
                f"(load_from=dict(path=..., strict=False) leaves them out)",
            )
        if missing:
            self.logger.warning("load_from: initialised, not loaded: %s", _first(missing))


def _reported(names: list[str], hf: object, patterns: str) -> list[str]:
    """``names`` less those the model's ``patterns`` attribute (transformers'
    ``_keys_to_ignore_on_load_*``) says to pass over silently."""
    return [n for n in names if not ignored(getattr(hf, patterns, None), n)]


def _first(names: list[str], n: int = 3) -> str:
    more = f" (and {len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors by name, sharded ones as this rank's DTensors (sharing storage)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return dict(get_model_state_dict(model))  # type: ignore[arg-type]
    return model.state_dict()


def _passes(
    state: dict[str, torch.Tensor], groups: list[tuple[list[str], str | None]]
) -> list[dict[str, torch.Tensor]]:
    """The tensors to fill, by file name, in as few loads as names repeat: two tensors can take
    one file tensor (PEFT's ``modules_to_save`` keeps the original module and its trained copy,
    both starting from the base weight). Under pipeline parallelism a rank holds its stages'
    tensors only (the names were checked against the files on the whole model)."""
    passes: list[dict[str, torch.Tensor]] = []
    for names, file in groups:
        if file is None or not any(n in state for n in names):
            continue  # no file, or another pipeline stage's tensor (this rank dropped it)
        free = next((p for p in passes if file not in p), None)
        if free is None:
            free = {}
            passes.append(free)
        free[file] = _pick(state, names)
    return passes


def _pick(state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """The tensor of a group of tied names, under whichever name ``state`` kept."""
    return next(state[n] for n in names if n in state)


def _init_missing(model: nn.Module, names: list[str]) -> None:
    """Initial values for parameters the files lack (``strict=False``), as ``from_pretrained``
    gives them: the model's ``_init_weights`` (transformers), else the module's own
    ``reset_parameters``; built on the CPU in full, before any sharding."""
    if not names:
        return
    hf = hf_model_of(model)
    owners = {name.rpartition(".")[0] for name in names}
    modules = dict(model.named_modules())
    for owner in sorted(owners):
        module = modules[owner]
        materialize_module(module, "cpu")
        if hf is not None and hasattr(hf, "_init_weights"):
            hf._init_weights(module)
        elif hasattr(module, "reset_parameters"):
            module.reset_parameters()
        else:
            raise ConfigError(
                KEY,
                f"{owner} has no weights in the files and no "
                f"reset_parameters() to initialise them: give the files "
                f"its tensors, or initialise it in the model's __init__",
            )


def checkpoint_bytes(folder: Path) -> int:
    """The weights' size in bytes (headers only), for reports and benchmarks."""
    return sum(
        math.prod(info.shape) * SAFETENSORS_DTYPES.get(info.dtype, 4)
        for info in tensor_index(folder).values()
    )
