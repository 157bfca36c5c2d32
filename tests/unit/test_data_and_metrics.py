"""DefaultSampler (sharding, reshuffling, resume position), collate functions, Accuracy."""
import pytest
import torch

from distributed_runner.data.loaders import DefaultSampler, build_dataloader, pseudo_collate
from distributed_runner.evaluation.evaluator import Accuracy, interleave
from tests.toy import ToyDataset


@pytest.mark.parametrize("n,world", [(10, 2), (11, 2), (7, 3), (4, 4)])
def test_shards_disjoint_covering_and_padded(n, world):
    shards = [DefaultSampler(range(n), shuffle=True, seed=3, rank=r, world_size=world)
              for r in range(world)]
    lists = [list(s) for s in shards]
    assert len({len(x) for x in lists}) == 1 and all(len(x) == len(s) for x, s in zip(lists, shards))
    flat = [i for x in lists for i in x]
    assert set(flat) == set(range(n))
    assert len(flat) - n == (-n) % world  # only the padding repeats
    unpadded = [i for r in range(world) for i in lists[r]]
    assert len(unpadded) == len(lists[0]) * world


def test_set_epoch_reshuffles_deterministically():
    s = DefaultSampler(range(50), shuffle=True, seed=1)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1 and sorted(e0) == sorted(e1)
    s.set_epoch(0)
    assert list(s) == e0


def test_resume_at_skips_consumed_samples_once():
    s = DefaultSampler(range(20), shuffle=True, seed=0)
    full = list(s)
    s.resume_at(8)
    assert list(s) == full[8:] and len(s) == 20
    assert list(s) == full  # the next pass is whole again


def test_unshuffled_shards_interleave_back_to_dataset_order():
    shards = [list(DefaultSampler(range(7), shuffle=False, rank=r, world_size=3)) for r in range(3)]
    assert interleave(shards)[:7] == list(range(7))


def test_dataloader_from_dict_uses_its_own_generator():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    loader = build_dataloader(dict(dataset=dict(type="ToyDataset", n=8), batch_size=4),
                              "train_dataloader", seed=0)
    list(loader)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG was not consumed
    assert isinstance(loader.sampler, DefaultSampler)


def test_pseudo_collate_keeps_items_unstacked():
    batch = [{"a": torch.zeros(2), "b": 1}, {"a": torch.zeros(3), "b": 2}]
    out = pseudo_collate(batch)
    assert [t.shape[0] for t in out["a"]] == [2, 3] and out["b"] == [1, 2]


def test_accuracy_topk():
    metric = Accuracy(topk=(1, 2))
    scores = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.5, 0.4, 0.1]])
    metric.process({"labels": torch.tensor([0, 2, 2, 2])}, scores)
    assert metric.evaluate(4) == {"accuracy/top1": 50.0, "accuracy/top2": 75.0}
    single = Accuracy()
    single.process((None, torch.tensor([0, 2, 2, 2])), scores)
    assert single.evaluate(4) == {"accuracy": 50.0}


def test_accuracy_drops_sampler_padding():
    metric = Accuracy()
    metric.results = [0, 0, 1]  # the third is the sampler's padding
    assert metric.evaluate(2) == {"accuracy": 100.0}


def test_toy_dataset_is_deterministic():
    assert torch.equal(ToyDataset(n=5).x, ToyDataset(n=5).x)
