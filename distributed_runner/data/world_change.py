"""A resume at another world size keeps the global batch, so it continues at the first sample not
yet trained and takes the same optimizer steps.

A checkpoint records ``global_batch``: the samples one iteration trained over all data-parallel
ranks (``train_dataloader.batch_size x ranks``, or an elastic run's fixed batch, :mod:`.elastic`).
Resumed on another number of ranks (a cluster that came back with fewer nodes, or more), a run
that simply rebuilt its loader would train batches of ``batch_size x new ranks``: the saved
``iter_in_epoch`` would point at another sample (stopped at iteration 40 of 2 workers x 6, 480
samples done, and resumed on 1: position 240, so 240 samples trained twice; from 1 worker to 2,
as many skipped), and the epoch's length, the iteration-based schedules and the samples per
optimizer step would change with it.

Instead the resumed run trains **the saved run's global batches**, in the same order: each rank
takes ``G / w`` samples of each, in micro-batches of at most ``batch_size`` (the elastic rule:
engine/step.py's ElasticStep trains them as one iteration), so the iteration counters, the
epochs' length, the schedules and ``accumulative_counts`` (optimizer steps every that many
iterations) stay the saved run's, and the run ends with the uninterrupted run's weights to float
tolerance (the gradient is summed in another order). It holds for ``DefaultSampler``'s
DataLoader and for ``StreamingLoader``; the new world size must divide ``G`` (one line naming
both otherwise) and, streamed, the ``num_streams``.

**A new global batch** is what a resume whose ``train_dataloader.batch_size`` differs from the
one the checkpoint was trained with asks for (``--cfg-options train_dataloader.batch_size=N``;
at the same world size any other global batch is that too): the run goes on at the saved data
pass's **sample position** ``p`` (the checkpoint's ``samples_in_epoch``), in global batches of
the new size ``G'`` cut from there, so no sample of that pass is trained twice or skipped; the
pass's last global batch is the rest (a smaller step, :mod:`.elastic`), the next passes are cut
from their start. The counters follow one rule: ``iter`` counts iterations of any size and goes
on from the saved value (``max_iters`` and iteration-based schedules count them: the steps from
the resume on are each a global batch of the new size); ``iter_in_epoch`` becomes ``p // G'``
(the checkpoint keeps ``p`` exactly); epochs and epoch-based schedules are unchanged; an epoch
has ``ceil(N / G')`` iterations from the next one on. At another world size ``w`` as well, ``p``
must divide by ``w`` (one line otherwise). ``DefaultSampler``'s DataLoader, the elastic and
exact-epoch re-cuts and ``StreamingLoader`` go on from ``p``; another sampler gets a one-line
refusal when ``p`` falls inside a batch of the new size, else resumes at its batch index.

Not adapted, with a warning that says what happens instead: another sampler or loader at another
world size (it resumes with the new size's batches, at the saved batch index, as before). A
checkpoint that records no global batch (written before it was recorded) resumes as before.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from torch.utils.data import DataLoader

from distributed_runner.core.errors import ConfigError
from distributed_runner.data.global_batch import GlobalBatchPlan
from distributed_runner.data.loaders import DefaultSampler


def saved_data_parallel(resumed: dict) -> int:
    """Data-parallel ranks of the run that wrote the checkpoint (``mesh``: replicate x shard, as
    checkpoint.parts.saved_mesh reads it, older checkpoints included)."""
    replicate, shard = resumed["mesh"][:2]
    return int(replicate) * int(shard)


def sample_position(meta: dict) -> int | None:
    """The saved data pass's sample position: ``samples_in_epoch``, or for a checkpoint written
    before it was recorded ``iter_in_epoch x global_batch``; None when neither says."""
    samples = meta.get("samples_in_epoch")
    if samples is not None:
        return int(samples)
    batches, global_batch = meta.get("iter_in_epoch"), meta.get("global_batch")
    if batches is None or not global_batch:
        return None
    return int(batches) * int(global_batch)


def asks_new_global_batch(batch_size: int, world_size: int, resumed: dict) -> bool:
    """Whether this resume trains another global batch than the checkpoint's on purpose: its
    ``train_dataloader.batch_size`` differs from the saved one, or (a checkpoint that does not
    record it) the world size is the same and the global batch is not."""
    saved = resumed.get("global_batch")
    if not saved:
        return False
    saved_size = resumed.get("batch_size")
    if saved_size is not None:
        return int(saved_size) != batch_size
    return saved_data_parallel(resumed) == world_size and int(saved) != batch_size * world_size


def check_sample_position(resumed: dict, global_batch: int, world_size: int) -> None:
    """A new global batch goes on at the saved sample position: every rank must take as many of
    each global batch from there, so ``world_size`` must divide it (one line otherwise)."""
    position = resumed.get("samples")
    if position is None or int(position) % world_size == 0:
        return
    raise ConfigError(
        "resume",
        f"the checkpoint stopped at sample {position} of its data pass, which {world_size} "
        f"data-parallel ranks cannot share evenly with a new global batch of {global_batch}: "
        f"resume with the checkpoint's batch_size ({resumed.get('batch_size')}) or on a number "
        f"of ranks that divides {position}",
    )


def new_global_batch(
    global_batch: int, world_size: int, resumed: dict, logger: logging.Logger
) -> None:
    """Say (and check) that the resume trains a new global batch from the saved position."""
    check_sample_position(resumed, global_batch, world_size)
    logger.info(
        "train_dataloader.batch_size: the checkpoint trained global batches of %s samples, "
        "this run's are %d: it goes on at sample %s of the data pass in batches of the new "
        "size; iter goes on from the saved count",
        resumed.get("global_batch"),
        global_batch,
        resumed.get("samples"),
    )


def kept_global_batch(
    loader: Any, world_size: int, rank: int, resumed: dict, logger: logging.Logger
) -> GlobalBatchPlan | None:
    """The plan that keeps the resumed checkpoint's global batch at this world size; None when
    the loader's own batches already are that run's (a fresh start, the same size, an older
    checkpoint), when the config asks for a new global batch (said; the loop goes on at the
    sample position) or when ``loader`` cannot be re-cut (warned)."""
    saved, batch_size = resumed.get("global_batch"), getattr(loader, "batch_size", None)
    if not saved or not isinstance(batch_size, int) or int(saved) == batch_size * world_size:
        return None
    saved, was = int(saved), saved_data_parallel(resumed)
    if asks_new_global_batch(batch_size, world_size, resumed):
        new_global_batch(batch_size * world_size, world_size, resumed, logger)
        return None
    if saved % world_size:
        raise ConfigError(
            "resume",
            f"the checkpoint trained global batches of {saved} samples on {was} data-parallel "
            f"ranks, which {world_size} cannot split evenly: resume on a number of ranks that "
            f"divides {saved}",
        )
    if not _can_recut(loader):
        logger.warning(
            "train_dataloader: the checkpoint was trained on %d data-parallel ranks, this run "
            "has %d, and only DefaultSampler's DataLoader or StreamingLoader can keep its "
            "global batch of %d: the run goes on in batches of %d from the saved sample "
            "position, in this sampler's order for the new ranks",
            was,
            world_size,
            saved,
            batch_size * world_size,
        )
        return None
    return GlobalBatchPlan.build(saved, batch_size, world_size, rank, kept_from=was)


def kept_stream_count(loader: Any, sizes: tuple[int, int], resumed: dict) -> None:
    """A StreamingLoader's auto ``num_streams`` fixed for the run: the resumed checkpoint's
    (its meta records it: the order stays the saved run's at any new world size), else the
    choice for every size ``sizes`` covers (an elastic group restarted at another size keeps
    its order). One line when the new world size cannot split the saved count."""
    if not getattr(loader, "auto_streams", False):
        return
    saved = resumed.get("num_streams")
    if saved:
        if int(saved) % loader.world_size:
            raise ConfigError(
                "resume",
                f"the checkpoint's run read its data in {saved} streams, which "
                f"{loader.world_size} data-parallel ranks cannot split evenly: resume on a "
                f"number of ranks that divides {saved}",
            )
        loader.set_streams(int(saved))
        return
    multiple = math.lcm(*range(sizes[0], sizes[1] + 1))
    if multiple != loader.world_size:
        loader.set_streams(loader.chosen_streams(multiple))


def stream_count(loader: Any) -> int | None:
    """The streams a StreamingLoader reads an epoch in, as the checkpoint's meta records it
    (None for other loaders)."""
    count = getattr(loader, "num_streams", None)
    return int(count) if isinstance(count, int) else None


def iteration_samples(loader: Any, plan: GlobalBatchPlan | None, world_size: int) -> int | None:
    """The samples one iteration trains over all data-parallel ranks, as the checkpoint's meta
    records it (None when the loader does not say: its batches are its own)."""
    if plan is not None:
        return plan.global_batch
    batch_size = getattr(loader, "batch_size", None)
    return batch_size * world_size if isinstance(batch_size, int) else None


def _can_recut(loader: Any) -> bool:
    if hasattr(loader, "use_global_batches"):  # StreamingLoader
        return True
    return isinstance(loader, DataLoader) and isinstance(loader.sampler, DefaultSampler)


def confirm_global_batch(meta: dict, peeked: dict, path: Any) -> None:
    """The checkpoint a resume loads must have the global batch of the one the loader was cut
    for (``peeked``: rank 0 read the newest before anything was built; a damaged newest file
    makes the resume take an older one, which a resize in between may have written with
    another global batch)."""
    saved, expected = meta.get("global_batch"), peeked.get("global_batch")
    if saved is None or expected is None or int(saved) == int(expected):
        return
    raise ConfigError(
        "resume",
        f"{path} trained global batches of {saved} samples, but this run was set up for "
        f"{expected} from the newest checkpoint (which did not load): resume from it by name "
        f"(--resume {path})",
    )
