"""Every sample once an epoch with ``DefaultSampler`` on several ranks (issue 48,
distributed_runner/data/elastic.py's exact_epochs and GlobalBatchSampler): a data set the ranks
cannot split evenly is not padded with samples trained twice; the epoch's last, smaller global
batch is trained as weighted micro-batches, so that two gloo ranks over a prime number of
samples end as one process with the double batch does; a model with its own ``train_step``
keeps MMEngine's padding, and the log says so."""
import logging
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from distributed_runner import Runner
from distributed_runner.data.elastic import (
    GlobalBatchLoader,
    GlobalBatchPlan,
    GlobalBatchSampler,
    exact_epochs,
)
from distributed_runner.data.global_batch import MicroBatches
from distributed_runner.data.loaders import DefaultSampler, epoch_order, resume_sampler
from tests.toy import base_cfg, train_on_gloo
from tests.unit.test_elastic import relative_gap

LOG = logging.getLogger("test_exact_epochs")


class Indices(Dataset):
    """Sample ``i`` is the tensor ``i``: a batch says which samples it holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def rank_loaders(n: int, world: int, batch_size: int, drop_last: bool = False, seed: int = 1):
    """Each rank's train loader as a fixed-size run of ``world`` ranks builds it."""
    data = Indices(n)
    return [exact_epochs(DataLoader(data, batch_size=batch_size, drop_last=drop_last,
                                    sampler=DefaultSampler(data, seed=seed, rank=r,
                                                           world_size=world)),
                         world, r, trains_itself=False, logger=LOG) for r in range(world)]


def trained(step) -> list[tuple[list[int], float]]:
    """(samples, loss factor) of each forward pass of one step; a plain batch counts 1."""
    if type(step) is MicroBatches:
        return [(part.tolist(), weight) for part, weight in zip(step, step.weights, strict=True)]
    return [(step.tolist(), 1.0)]


@pytest.mark.parametrize("n,world,batch_size", [(1009, 2, 6), (1009, 3, 6), (67, 4, 4),
                                                (10, 4, 2), (1500, 7, 6)])
def test_an_epoch_trains_every_sample_once_and_the_tail_is_the_mean_of_its_samples(
        n, world, batch_size):
    loaders = rank_loaders(n, world, batch_size)
    global_batch = batch_size * world
    steps = [list(loader) for loader in loaders]
    # every rank makes as many steps, as many passes in each (DDP's collectives), len() says so
    assert {len(s) for s in steps} == {len(loaders[0])} == {-(-n // global_batch)}
    for t in range(len(steps[0])):
        assert len({len(trained(s[t])) for s in steps}) == 1, t
    counts = Counter(i for s in steps for step in s for part, w in trained(step) if w
                     for i in part)
    assert sorted(counts) == list(range(n)) and set(counts.values()) == {1}
    # the full global batches are DefaultSampler's, each rank its usual samples
    order = epoch_order(n, True, 1, 0)
    full = n // global_batch
    for r, s in enumerate(steps):
        assert [step.tolist() for step in s[:full]] == [
            order[t * global_batch + r:(t + 1) * global_batch:world] for t in range(full)]
    # the tail of S samples: each pass's loss weighted w x rows / S (0 for a padding pass), so
    # the ranks' averaged gradient (1/w) sum w_i mean_i is the mean over the S samples
    tail = n % global_batch
    passes = [trained(s[-1]) for s in steps]
    for ranks in passes:
        assert all(w == world * len(part) / tail or w == 0 for part, w in ranks)
    assert sum(w for ranks in passes for _, w in ranks) / world == pytest.approx(1)
    assert sum(len(part) for ranks in passes for part, w in ranks if w) == tail
    assert loaders[0].weighted_tail


def test_a_data_set_the_ranks_split_evenly_keeps_its_dataloader():
    data = Indices(64)
    loader = DataLoader(data, batch_size=5, sampler=DefaultSampler(data, rank=0, world_size=2))
    assert exact_epochs(loader, 2, 0, trains_itself=False, logger=LOG) is loader
    assert exact_epochs(loader, 1, 0, trains_itself=False, logger=LOG) is loader


def test_drop_last_drops_the_last_global_batch_and_nothing_is_trained_twice():
    loaders = rank_loaders(1009, 2, 6, drop_last=True)
    assert not loaders[0].weighted_tail and len(loaders[0]) == 1009 // 12
    seen = Counter(i for loader in loaders for step in loader for i in step.tolist())
    assert len(seen) == 1009 // 12 * 12 and set(seen.values()) == {1}


def test_a_rank_with_no_sample_left_repeats_a_batch_of_its_own_without_reading_one_again():
    """10 samples, 4 ranks of 2: the last global batch has 2 samples, ranks 2 and 3 none; their
    weight-0 pass repeats their previous batch (the dataset is read once per sample); resumed
    at the tail itself, such a rank reads one sample for it."""
    reads = Counter()

    class Counted(Indices):
        def __getitem__(self, i):
            reads[i] += 1
            return super().__getitem__(i)

    data = Counted(10)
    loader = exact_epochs(DataLoader(data, batch_size=2, sampler=DefaultSampler(
        data, seed=1, rank=3, world_size=4)), 4, 3, trains_itself=False, logger=LOG)
    *_, tail = list(loader)
    assert tail.weights == [0.0] and set(reads.values()) == {1}
    assert resume_sampler(loader, 0, 1)  # at the tail: no batch of this pass to repeat
    (tail,) = list(loader)
    assert tail.weights == [0.0] and len(tail[0]) == 1


def test_a_resume_starts_at_the_first_global_batch_not_yet_trained():
    (loader, _) = rank_loaders(67, 2, 4)
    whole = [trained(step) for step in loader]
    assert resume_sampler(loader, 0, 5)  # the loop's batches consumed
    assert [trained(step) for step in loader] == whole[5:]
    assert [trained(step) for step in loader] == whole  # once; then whole epochs


def test_an_elastic_groups_last_global_batch_is_its_remaining_samples_weighted():
    data = Indices(50)
    sampler = GlobalBatchSampler(data, GlobalBatchPlan.build(16, 4, 1, 0), seed=3)
    loader = GlobalBatchLoader(DataLoader(data, batch_sampler=sampler), sampler.plan)
    *_, tail = list(loader)
    assert [part.tolist() for part in tail] == [epoch_order(50, True, 3, 0)[48:]]
    assert tail.weights == [1.0] and len(loader) == 4


def test_a_model_with_its_own_train_step_keeps_mmengines_padding_and_the_log_says_so(caplog):
    data = Indices(1009)
    loader = DataLoader(data, batch_size=6, sampler=DefaultSampler(data, rank=0, world_size=2))
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert exact_epochs(loader, 2, 0, trains_itself=True, logger=LOG) is loader
    assert ("the model's own train_step trains one batch per call, so DefaultSampler pads each "
            "epoch's 1009 samples to a multiple of 2 ranks as MMEngine does (1 of them trained "
            "twice)") in caplog.text


def prime_cfg(work_dir, batch_size: int, **extra) -> dict:
    """43 samples (a prime), 3 epochs of SGD with momentum on TinyBlocks (LayerNorm: no batch
    statistics): with 2 ranks of 4 an epoch is 5 global batches of 8 and one of 3."""
    return base_cfg(work_dir, model=dict(type="TinyBlocks"),
                    val_dataloader=None, val_evaluator=None, val_cfg=None,
                    train_dataloader=dict(dataset=dict(type="ToyDataset", n=43),
                                          batch_size=batch_size,
                                          sampler=dict(type="DefaultSampler", shuffle=True)),
                    train_cfg=dict(by_epoch=True, max_epochs=3),
                    optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.2, momentum=0.9)),
                    randomness=dict(seed=0), **extra)


@pytest.mark.slow("two gloo processes train beside a run in this process")
def test_two_ranks_over_a_prime_number_of_samples_end_as_one_process_with_the_double_batch(
        tmp_path):
    train_on_gloo(prime_cfg(tmp_path / "two", batch_size=4))
    alone = Runner.from_cfg(prime_cfg(tmp_path / "one", batch_size=8))
    alone.train()
    final = torch.load(tmp_path / "two" / "epoch_3.pth")["state_dict"]
    assert relative_gap(final, alone.model.state_dict()) < 1e-5
