"""Metrics and the evaluator that gathers them across ranks.

A metric sees every batch (``process(data_batch, outputs)``), keeps one small result per sample in
``self.results``, and computes its numbers once from the results of *all* ranks
(``compute(results) -> dict``). Samples are gathered in dataset order and the padding the sharded
sampler added is dropped, so every rank computes the same metrics a single process would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import METRICS


class BaseMetric:
    """Subclass and implement ``process`` and ``compute`` (MMEngine's ``compute_metrics`` works)."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix
        self.results: list[Any] = []

    def process(self, data_batch: Any, outputs: Any) -> None:
        raise NotImplementedError

    def metric_names(self) -> list[str] | None:
        """The keys :meth:`compute` returns (before the prefix), if known before evaluating —
        so ``save_best``/``monitor`` typos fail before training, not after the first epoch.
        None (the default) means unknown: those checks then wait for the first validation."""
        return None

    def compute(self, results: list) -> dict[str, float]:
        compute_metrics = getattr(self, "compute_metrics", None)
        if compute_metrics is None:
            raise NotImplementedError(f"{type(self).__name__} must implement compute(results)")
        return compute_metrics(results)

    def evaluate(self, size: int) -> dict[str, float]:
        """Gather results from all ranks, keep the first ``size`` in dataset order, compute."""
        # a tensor-parallel group's (a pipeline's) ranks hold the same results: one of each
        gathered = dist.one_per_data_rank(dist.all_gather_object(self.results))
        self.results = []
        ordered = interleave(gathered)[:size] if len(gathered) > 1 else gathered[0][:size]
        metrics = self.compute(ordered)
        if self.prefix:
            metrics = {f"{self.prefix}/{k}": v for k, v in metrics.items()}
        return metrics


def interleave(per_rank: Sequence[Sequence[Any]]) -> list[Any]:
    """Undo the sampler's rank sharding (rank r holds samples r, r+W, r+2W ...)."""
    out: list[Any] = []
    longest = max(len(r) for r in per_rank)
    for i in range(longest):
        for rank_results in per_rank:
            if i < len(rank_results):
                out.append(rank_results[i])
    return out


def _labels_from(data_batch: Any, label_key: str) -> torch.Tensor:
    if isinstance(data_batch, dict):
        return data_batch[label_key]
    if isinstance(data_batch, (tuple, list)):
        return data_batch[-1]
    raise TypeError(
        "Accuracy needs batches that are dicts (with the label key) or (inputs, labels) tuples"
    )


@METRICS.register_module()
class Accuracy(BaseMetric):
    """Top-k classification accuracy in percent.

    ``outputs`` is the model's ``mode='predict'`` result: class scores ``[B, C]`` (or a dict with
    ``pred_key``). Labels come from ``data_batch[label_key]`` (dict batches) or the last element of
    a tuple batch. With one ``k`` the metric is ``accuracy``; with several, ``accuracy/top{k}``.
    """

    def __init__(
        self,
        topk: int | Sequence[int] = 1,
        label_key: str = "labels",
        pred_key: str | None = None,
        prefix: str | None = None,
    ) -> None:
        super().__init__(prefix)
        self.topk = (topk,) if isinstance(topk, int) else tuple(topk)
        if not self.topk or any(k < 1 for k in self.topk):
            raise ConfigError("val_evaluator.topk", "must be positive ints, e.g. topk=(1, 5)")
        self.label_key = label_key
        self.pred_key = pred_key

    def process(self, data_batch: Any, outputs: Any) -> None:
        scores = outputs[self.pred_key] if self.pred_key else outputs
        labels = _labels_from(data_batch, self.label_key).to(scores.device)
        maxk = min(max(self.topk), scores.shape[-1])
        top = scores.topk(maxk, dim=-1).indices
        hits = top.eq(labels.reshape(-1, 1))
        # per sample: the rank (0-based) of the true class within the top-k, or maxk if absent
        first_hit = torch.where(
            hits.any(dim=1), hits.float().argmax(dim=1), torch.full_like(labels.reshape(-1), maxk)
        )
        self.results.extend(first_hit.cpu().tolist())

    def metric_names(self) -> list[str]:
        return ["accuracy"] if len(self.topk) == 1 else [f"accuracy/top{k}" for k in self.topk]

    def compute(self, results: list) -> dict[str, float]:
        n = max(len(results), 1)
        ranks = torch.tensor(results, dtype=torch.long)
        accs = {k: float((ranks < k).sum()) * 100.0 / n for k in self.topk}
        if len(self.topk) == 1:
            return {"accuracy": accs[self.topk[0]]}
        return {f"accuracy/top{k}": v for k, v in accs.items()}


class Evaluator:
    """One or more metrics behind the ``process`` / ``evaluate`` pair the loops call."""

    def __init__(self, metrics: Sequence[BaseMetric]) -> None:
        self.metrics = list(metrics)

    def metric_names(self) -> list[str] | None:
        """Every key :meth:`evaluate` returns, prefixes included; None if a metric does not
        declare its names."""
        names: list[str] = []
        for metric in self.metrics:
            declared = metric.metric_names() if hasattr(metric, "metric_names") else None
            if declared is None:
                return None
            prefix = getattr(metric, "prefix", None)
            names += [f"{prefix}/{n}" if prefix else n for n in declared]
        return names

    @classmethod
    def build(cls, spec: Any, key: str) -> Evaluator:
        if isinstance(spec, Evaluator):
            return spec
        specs = spec if isinstance(spec, (list, tuple)) else [spec]
        metrics = [
            METRICS.build(s, f"{key}[{i}]" if len(specs) > 1 else key) for i, s in enumerate(specs)
        ]
        return cls(metrics)

    def process(self, data_batch: Any, outputs: Any) -> None:
        for m in self.metrics:
            m.process(data_batch, outputs)

    def evaluate(self, size: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for m in self.metrics:
            for k, v in m.evaluate(size).items():
                if k in metrics:
                    raise ValueError(f"two metrics both report {k!r}: give one a prefix=")
                metrics[k] = v
        return metrics
