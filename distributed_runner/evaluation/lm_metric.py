"""Perplexity: a language model's validation loss and perplexity over the whole validation set.

Hugging Face's convention: ``labels`` are aligned with ``input_ids`` and shifted inside (the
logits at position t predict the label at t + 1), ``-100`` marks positions to ignore, and a batch
without ``labels`` is scored on its ``input_ids``. The loss is the mean token cross-entropy over
every scored token of the set — token-weighted, so batches (and ranks) with more tokens weigh
more, and it equals one cross-entropy over the concatenated set, not a mean of per-batch means.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import METRICS
from distributed_runner.evaluation.evaluator import BaseMetric
from distributed_runner.model.classifier import logits_of


@METRICS.register_module()
class Perplexity(BaseMetric):
    """``loss`` (mean token cross-entropy, nats) and ``perplexity`` (``exp(loss)``).

    ``outputs``: the model's predictions, logits ``[B, T, V]`` or a mapping/object holding them
    as ``logits``. ``label_key`` (``'labels'``, else ``input_key``, ``'input_ids'``) gives the
    targets; ``shift=False`` for models whose logits are already aligned with their labels.
    Results are kept per sample — (summed cross-entropy, scored tokens) — so the evaluator's
    dataset-order gathering drops the sampler's padding exactly as for any metric.
    """

    def __init__(
        self,
        label_key: str = "labels",
        input_key: str = "input_ids",
        ignore_index: int = -100,
        shift: bool = True,
        prefix: str | None = None,
    ) -> None:
        super().__init__(prefix)
        if not isinstance(label_key, str) or not isinstance(input_key, str):
            raise ArgumentError("label_key", "label_key and input_key are batch keys (str)")
        self.label_key, self.input_key = label_key, input_key
        self.ignore_index, self.shift = int(ignore_index), bool(shift)

    def _targets(self, data_batch: Any) -> torch.Tensor:
        if not isinstance(data_batch, dict):
            raise TypeError(
                f"Perplexity needs dict batches (with {self.label_key!r} or "
                f"{self.input_key!r}), got {type(data_batch).__name__}"
            )
        for key in (self.label_key, self.input_key):
            if data_batch.get(key) is not None:
                return data_batch[key]
        raise KeyError(
            f"Perplexity: the batch has neither {self.label_key!r} nor "
            f"{self.input_key!r} (val_evaluator.label_key / input_key); its keys: "
            f"{', '.join(data_batch)}"
        )

    @torch.no_grad()
    def process(self, data_batch: Any, outputs: Any) -> None:
        logits = logits_of(outputs)
        labels = self._targets(data_batch).to(logits.device)
        if self.shift:
            logits, labels = logits[:, :-1], labels[:, 1:]
        # float32 at least: bf16 logits would round the per-token losses
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            labels.reshape(-1),
            ignore_index=self.ignore_index,
            reduction="none",
        )
        per_sample = nll.view(labels.shape).sum(dim=1, dtype=torch.float64)
        tokens = (labels != self.ignore_index).sum(dim=1)
        self.results.extend(zip(per_sample.tolist(), tokens.tolist(), strict=True))

    def metric_names(self) -> list[str]:
        return ["loss", "perplexity"]

    def compute(self, results: list) -> dict[str, float]:
        total = math.fsum(nll for nll, _ in results)
        tokens = sum(n for _, n in results)
        loss = total / tokens if tokens else float("nan")
        return {"loss": loss, "perplexity": math.exp(loss) if loss < 709 else float("inf")}
