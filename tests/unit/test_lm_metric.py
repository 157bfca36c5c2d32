"""Perplexity: token-weighted validation loss of a language model, exact across batches/ranks."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from distributed_runner.core import dist
from distributed_runner.core.registry import DATASETS, METRICS, MODELS
from distributed_runner.evaluation.evaluator import Evaluator
from distributed_runner.evaluation.lm_metric import Perplexity
from tests.toy import make_runner

V, T = 11, 7


def corpus(n: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits, input_ids and labels with some -100 (padding of varying length per sample)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, T, V, generator=g)
    ids = torch.randint(0, V, (n, T), generator=g)
    labels = ids.clone()
    for i in range(n):
        labels[i, T - i % 4:] = -100  # 0..3 ignored positions at the end
    return logits, ids, labels


def by_hand(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """One cross-entropy over every shifted, non-ignored token of the set."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, V).double(), labels[:, 1:].reshape(-1),
                           ignore_index=-100).item()


def test_matches_a_hand_computation_over_uneven_batches():
    logits, ids, labels = corpus()
    metric = Perplexity()
    for lo, hi in ((0, 4), (4, 5), (5, 9)):  # batches of 4, 1 and 4 samples
        metric.process({"input_ids": ids[lo:hi], "labels": labels[lo:hi]}, logits[lo:hi])
    out = metric.evaluate(len(ids))
    assert out["loss"] == pytest.approx(by_hand(logits, labels), rel=1e-6)
    assert out["perplexity"] == pytest.approx(math.exp(by_hand(logits, labels)), rel=1e-6)
    # a mean of per-batch means would differ: the batches hold different numbers of tokens
    means = [by_hand(logits[lo:hi], labels[lo:hi]) for lo, hi in ((0, 4), (4, 5), (5, 9))]
    assert abs(sum(means) / 3 - out["loss"]) > 1e-3


def test_input_ids_when_no_labels_and_logits_inside_an_output_object():
    logits, ids, _ = corpus()

    class CausalLMOutput(dict):  # as Hugging Face's ModelOutput: a mapping with attributes
        def __getattr__(self, name):
            return self[name]

    metric = Perplexity(prefix="lm")
    metric.process({"input_ids": ids}, CausalLMOutput(loss=torch.tensor(0.0), logits=logits))
    assert metric.evaluate(len(ids))["lm/loss"] == pytest.approx(by_hand(logits, ids), rel=1e-6)
    with pytest.raises(KeyError, match="label_key"):
        Perplexity().process({"tokens": ids}, logits)


def test_exact_across_ranks_with_uneven_shards(monkeypatch):
    """Rank 0 holds samples 0, 2, 4, ...; rank 1 samples 1, 3, ... and one padding repeat."""
    logits, ids, labels = corpus(n=7)
    ranks = [Perplexity(), Perplexity()]
    for r, metric in enumerate(ranks):
        picks = list(range(r, 7, 2)) + ([0] if r == 1 else [])  # the sampler pads rank 1
        metric.process({"labels": labels[picks]}, logits[picks])
    monkeypatch.setattr(dist, "all_gather_object", lambda _: [m.results for m in ranks])
    out = ranks[0].evaluate(7)  # the padding sample is dropped
    assert out["loss"] == pytest.approx(by_hand(logits, labels), rel=1e-6)


def test_declares_its_names_and_is_registered():
    assert Perplexity().metric_names() == ["loss", "perplexity"]
    evaluator = Evaluator.build([dict(type="Perplexity", prefix="lm"), dict(type="Accuracy")],
                                "val_evaluator")
    assert evaluator.metric_names() == ["lm/loss", "lm/perplexity", "accuracy"]
    assert METRICS.get("Perplexity") is Perplexity


@DATASETS.register_module(force=True)
class TokenBlocks(Dataset):
    def __init__(self, n: int = 10) -> None:
        self.ids = torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@MODELS.register_module(force=True)
class BigramLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(V, V)

    def forward(self, input_ids, labels=None, mode="predict"):
        logits = self.table(input_ids)
        if mode == "loss":
            return {"loss": F.cross_entropy(logits[:, :-1].reshape(-1, V),
                                            labels[:, 1:].reshape(-1))}
        return logits


def test_validation_of_a_language_model_logs_loss_and_perplexity(tmp_path):
    loader = dict(dataset=dict(type="TokenBlocks", n=10), batch_size=3,
                  sampler=dict(type="DefaultSampler", shuffle=False))
    runner = make_runner(tmp_path, model=dict(type="BigramLM"), train_dataloader=loader,
                         val_dataloader=loader, val_evaluator=dict(type="Perplexity"),
                         train_cfg=dict(by_epoch=True, max_epochs=1, val_interval=1))
    runner.train()
    lines = [json.loads(x) for x in (tmp_path / "logs" / "scalars.jsonl").read_text().splitlines()]
    val = [x for x in lines if x["mode"] == "val"][-1]
    ids = TokenBlocks(10).ids
    with torch.no_grad():
        expected = by_hand(runner.model.eval()(ids.to(runner.device)).cpu(), ids)
    assert val["loss"] == pytest.approx(expected, rel=1e-6)
    assert val["perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)
