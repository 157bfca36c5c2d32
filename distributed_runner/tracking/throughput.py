"""Training throughput for the logs: samples/s, tokens/s and MFU, as IterTimerHook records them.

Each iteration adds one value per figure to the MessageHub — the iteration's rate, weighted by
its duration in whole microseconds (the history's ``count``) — so the weighted mean LoggerHook
takes over a logging window is exactly ``sum(samples) / sum(seconds)`` of that window, whatever
the window (iterations, epochs, wall time). No change to the record path: the figures reach every
sink (terminal, JSON lines, TensorBoard, MLflow ...) as ``train/samples_per_s`` and friends.

Counting costs metadata only: ``len(batch['inputs'])``, ``input_ids.numel()``. An
``attention_mask`` is summed on its own device and the sum stays a tensor in the history, read
(one sync for all of them) when LoggerHook writes a record — never on the other iterations.

``samples_per_s`` and ``tokens_per_s`` are the whole run's (each rank's rate times the world
size; LoggerHook averages over ranks), ``mfu`` a device's: ``tokens/s per device x FLOPs per
token / peak FLOP/s of the device``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.log import LOGGER_NAME

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' data sheets; fp16 for
# GPUs without bf16 (V100, T4). Matched in order against torch.cuda.get_device_name() (so the
# specific names come before the general ones: 'H100 PCIe' before 'H100').
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"GH200", 989.4),
    (r"H200 NVL", 835.5),
    (r"H200", 989.4),
    (r"H100 NVL", 835.5),
    (r"H100 PCIe", 756.0),
    (r"H100", 989.4),
    (r"H800", 989.4),
    (r"B200", 2250.0),
    (r"A100", 312.0),
    (r"A800", 312.0),
    (r"A10G", 70.0),
    (r"\bA10\b", 125.0),
    (r"A30", 165.0),
    (r"A40", 149.7),
    (r"L40S", 362.1),
    (r"L40", 181.0),
    (r"\bL4\b", 121.0),
    (r"RTX A6000", 154.8),
    (r"RTX 6000 Ada", 364.2),
    (r"RTX 4090", 165.2),
    (r"RTX 3090", 71.0),
    (r"V100", 125.0),
    (r"\bT4\b", 65.0),
    (r"MI300X", 1307.4),
    (r"MI250X", 383.0),
)

SAMPLES, TOKENS, MFU = "train/samples_per_s", "train/tokens_per_s", "train/mfu"


def per_second(scale: float, figure: tuple[Any, float]) -> tuple[float, int]:
    """A step's ``(count, seconds)`` as (count x ``scale`` per microsecond, the step's
    microseconds): its rate and its weight in a window's mean."""
    count, seconds = figure
    us = int(seconds * 1e6 + 0.5) or 1
    return count * (scale / us), us


_CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def peak_tflops_of(device_name: str, overrides: dict | None = None) -> float | None:
    """The dense bf16 peak of ``device_name`` (``overrides`` first: pattern -> TFLOP/s), or None."""
    for pattern, tflops in [*(overrides or {}).items(), *PEAK_TFLOPS]:
        if re.search(pattern, device_name, re.IGNORECASE):
            return float(tflops)
    return None


def flop_params(model: nn.Module) -> int:
    """N of the 6N rule: trainable parameters, each shared one once, less the embedding tables
    that are only looked up (token and position embeddings) — torchtitan's ``exclude_embedding``
    convention (Kaplan et al.'s non-embedding N). A table tied to an output ``nn.Linear`` (GPT-2's
    head) stays: its matmul runs for every token."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    matmul_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) not in matmul_weights:
            params.pop(id(module.weight), None)
    return sum(p.numel() for p in params.values())


def _check_key(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ArgumentError(name, f"expected 'auto', None or a batch key, got {value!r}")


def _check_options(
    samples_key: Any, tokens_key: Any, flops_per_token: Any, peak_tflops: Any
) -> None:
    """One-line errors for values the meter cannot use (names are the hook's arguments)."""
    _check_key("samples_key", samples_key)
    _check_key("tokens_key", tokens_key)
    if not (
        flops_per_token in (None, "auto", "6N")
        or (
            isinstance(flops_per_token, (int, float))
            and not isinstance(flops_per_token, bool)
            and flops_per_token > 0
        )
    ):
        raise ArgumentError(
            "flops_per_token",
            f"expected 'auto', '6N', None or a positive "
            f"number of FLOPs per token, got "
            f"{flops_per_token!r}",
        )
    ok = (
        peak_tflops is None
        or (isinstance(peak_tflops, (int, float)) and peak_tflops > 0)
        or (
            isinstance(peak_tflops, dict)
            and all(
                isinstance(k, str) and isinstance(v, (int, float)) and v > 0
                for k, v in peak_tflops.items()
            )
        )
    )
    if not ok or isinstance(peak_tflops, bool):
        raise ArgumentError(
            "peak_tflops",
            f"expected None (the built-in table), TFLOP/s per "
            f"device, or {{'device name pattern': TFLOP/s}}, got "
            f"{peak_tflops!r}",
        )


def sample_counter(batch: Any, key: str | None) -> Callable[[Any], Any] | None:
    """How to count the samples of batches shaped like ``batch`` (``key``: 'auto' or a dict key),
    or None when they cannot be counted cheaply."""
    if isinstance(batch, dict):
        if key == "auto":  # the first entry holding one row per sample, preferred names first
            names = [k for k in ("inputs", "input_ids", "pixel_values") if k in batch]
            key = next(
                (
                    k
                    for k in [*names, *batch]
                    if isinstance(batch[k], (list, tuple))
                    or (torch.is_tensor(batch[k]) and batch[k].dim())
                ),
                None,
            )
        if key is None or key not in batch:
            return None
        value = batch[key]
        if isinstance(value, int) or (torch.is_tensor(value) and not value.dim()):
            return lambda b: b[key]
        if type(value) is torch.Tensor:  # the common case, in one call
            return lambda b: b[key].shape[0]
        return lambda b: _rows(b[key])
    if isinstance(batch, (list, tuple)) and batch and key == "auto":
        return lambda b: _rows(b[0])
    if torch.is_tensor(batch) and batch.dim() and key == "auto":
        return _rows
    return None


def _count(counter: Callable[[Any], Any], batch: Any, parts: list | None) -> Any:
    """``counter`` of a step's batch, or the sum over the micro-batches it trained."""
    return counter(batch) if parts is None else sum(counter(part) for part in parts)


def _rows(value: Any) -> int:
    """``len(value)``; for a tensor its first dimension read directly (``len`` of a tensor goes
    through Python-level torch-function checks, a microsecond and a half every step)."""
    return value.shape[0] if type(value) is torch.Tensor else len(value)


def token_counter(batch: Any, key: str | None) -> Callable[[Any], Any] | None:
    """How to count the tokens of batches shaped like ``batch``: 'auto' sums ``attention_mask``
    (on its device) or takes ``input_ids.numel()``; a declared key holds a count (an int or 0-dim
    tensor), a mask (bool, or a name ending in 'mask': summed) or token ids (``numel``)."""
    if not isinstance(batch, dict) or key is None:
        return None
    if key == "auto":
        key = next((k for k in ("attention_mask", "input_ids") if k in batch), None)
        if key is None:
            return None
    if key not in batch:
        return None
    value = batch[key]
    if isinstance(value, int) or (torch.is_tensor(value) and not value.dim()):
        return lambda b: b[key]
    if not torch.is_tensor(value):
        return None
    if value.dtype == torch.bool or key.endswith("mask"):
        return lambda b: b[key].sum()
    return lambda b: b[key].numel()


class ThroughputMeter:
    """IterTimerHook's throughput part: configured once, told about each training iteration.

    ``samples_key`` / ``tokens_key``: ``'auto'`` (see :func:`sample_counter`,
    :func:`token_counter`), a batch key, or None (off). ``flops_per_token``: FLOPs of one
    training step per token (forward and backward), ``'6N'`` (:func:`flop_params`), ``'auto'``
    (the model's own ``flops_per_token`` attribute, else 6N for a Hugging Face causal LM —
    ``...ForCausalLM``/``...LMHeadModel`` — else none) or None. ``peak_tflops``: a device's peak
    TFLOP/s, ``{'name pattern': TFLOP/s}`` consulted before :data:`PEAK_TFLOPS`, or None (the
    table; nothing on a CPU). MFU needs both.
    """

    def __init__(
        self,
        samples_key: str | None = "auto",
        tokens_key: str | None = "auto",
        flops_per_token: str | float | None = "auto",
        peak_tflops: float | dict | None = None,
    ) -> None:
        _check_options(samples_key, tokens_key, flops_per_token, peak_tflops)
        self.samples_key, self.tokens_key = samples_key, tokens_key
        self.flops_per_token, self.peak_tflops = flops_per_token, peak_tflops
        self.flops: float | None = None  # per token, once training starts
        self.peak: float | None = None  # TFLOP/s of this rank's device
        self._samples: Callable[[Any], Any] | None = None
        self._tokens: Callable[[Any], Any] | None = None
        self._chosen = False
        self._rate_scale = 1e6
        self._mfu_scale = 0.0
        # the hub's writers of the rates, made at the first batch (_start_recording)
        self._write_samples: Callable[[Any], None] | None = None
        self._write_tokens: Callable[[Any], None] | None = None
        self._write_mfu: Callable[[Any], None] | None = None

    def start(
        self, model: nn.Module, device: torch.device, world_size: int, tensor_parallel: int = 1
    ) -> None:
        """Before training: the world size, FLOPs per token and the device's peak.

        Under tensor parallelism the ``tensor_parallel`` ranks of a group share each batch: the
        run's rates count a group once, and each rank does ``1/tensor_parallel`` of the FLOPs."""
        self._chosen = False
        tp = max(int(tensor_parallel), 1)
        replicas = max(int(world_size) // tp, 1)
        self._rate_scale = 1e6 * replicas  # rates per microsecond -> per second, the whole run
        self.flops = self._flops_per_token(model)
        self.peak = self._device_peak(device)
        self._mfu_scale = (
            (self.flops * 1e6 / (self.peak * 1e12 * tp)) if self.flops and self.peak else 0.0
        )

    def _flops_per_token(self, model: nn.Module) -> float | None:
        choice = self.flops_per_token
        if choice is None or isinstance(choice, (int, float)):
            return choice
        if choice == "auto":
            declared = getattr(model, "flops_per_token", None)
            if isinstance(declared, (int, float)) and declared > 0:
                return float(declared)
            if not type(model).__name__.endswith(_CAUSAL_LM_SUFFIXES):
                return None
        return 6.0 * flop_params(model)

    def _device_peak(self, device: torch.device) -> float | None:
        if isinstance(self.peak_tflops, (int, float)):
            return float(self.peak_tflops)
        if device.type != "cuda":
            return None
        return peak_tflops_of(torch.cuda.get_device_name(device), self.peak_tflops)

    def _start_recording(self, hub: Any) -> None:
        """Each step's counts and seconds go to the hub's writers of the rates
        (:meth:`~distributed_runner.engine.message_hub.MessageHub.scalar_writer`), which turn them
        into the rates, weighted by the step's microseconds, when the histories are read."""
        rate = partial(per_second, self._rate_scale)
        self._write_samples = hub.scalar_writer(SAMPLES, rate) if self._samples else None
        self._write_tokens = hub.scalar_writer(TOKENS, rate) if self._tokens else None
        self._write_mfu = (
            hub.scalar_writer(MFU, partial(per_second, self._mfu_scale))
            if self._tokens and self._mfu_scale
            else None
        )

    def _choose(self, batch: Any) -> None:
        """At the first batch: how this run's batches are counted."""
        self._chosen = True
        self._samples = sample_counter(batch, self.samples_key) if self.samples_key else None
        self._tokens = token_counter(batch, self.tokens_key)
        explicit = [
            k
            for k, c in (("samples_key", self._samples), ("tokens_key", self._tokens))
            if c is None and getattr(self, k) not in (None, "auto")
        ]
        for name in explicit:
            logging.getLogger(LOGGER_NAME).warning(
                "IterTimerHook: %s=%r is not in the batch; no throughput from it",
                name,
                getattr(self, name),
            )

    def record(self, hub: Any, batch: Any, seconds: float, parts: list | None = None) -> None:
        """One iteration of ``seconds`` on ``batch``. Only its counts are written here: the rates
        are computed when the hub's histories are read (:func:`per_second`), every figure as it
        would have been at once. ``parts``: the micro-batches the step trained, when it trained
        several (an elastic or resized step's, or an epoch's weighted last one beside plain
        steps): each counted as a plain batch, and summed."""
        if not self._chosen:
            if parts == []:
                return  # nothing of this rank's to learn the batches' shape from
            self._choose(batch if parts is None else parts[0])
            self._start_recording(hub)
        try:
            # both counted before either is written: a batch that cannot be counted writes none
            samples = (
                _count(self._samples, batch, parts) if self._write_samples is not None else None  # type: ignore[arg-type]
            )
            tokens = (
                _count(self._tokens, batch, parts) if self._write_tokens is not None else None  # type: ignore[arg-type]
            )
            if self._write_samples is not None:
                self._write_samples((samples, seconds))
            if self._write_tokens is not None:
                self._write_tokens((tokens, seconds))
                if self._write_mfu is not None:
                    self._write_mfu((tokens, seconds))
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            # a batch unlike the first: stop rather than log a window mixing counted and not
            logging.getLogger(LOGGER_NAME).warning(
                "IterTimerHook: cannot count this batch (%s: %s); throughput no longer logged",
                type(e).__name__,
                e,
            )
            self._samples = self._tokens = None
            self._write_samples = self._write_tokens = self._write_mfu = None
