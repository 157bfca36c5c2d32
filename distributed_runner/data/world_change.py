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

Not adapted, with a warning that says what happens instead: another sampler or loader (it
resumes with the new size's batches, at the saved batch index, as before); a config whose own
global batch changed at the same world size (``batch_size`` edited: the resumed epoch continues
at the saved batch index of the new size). A checkpoint that records no global batch (written
before it was recorded) resumes as before.
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


def kept_global_batch(
    loader: Any, world_size: int, rank: int, resumed: dict, logger: logging.Logger
) -> GlobalBatchPlan | None:
    """The plan that keeps the resumed checkpoint's global batch at this world size; None when
    the loader's own batches already are that run's (a fresh start, the same size, an older
    checkpoint) or when ``loader`` cannot be re-cut (warned)."""
    saved, batch_size = resumed.get("global_batch"), getattr(loader, "batch_size", None)
    if not saved or not isinstance(batch_size, int) or int(saved) == batch_size * world_size:
        return None
    saved, was = int(saved), saved_data_parallel(resumed)
    if was == world_size:
        logger.warning(
            "train_dataloader.batch_size: the checkpoint trained global batches of %d samples, "
            "this config's are %d: the resumed epoch continues at the saved batch index of the "
            "new size, not at the first sample not yet trained",
            saved,
            batch_size * world_size,
        )
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
            "global batch of %d: the run resumes with batches of %d at the saved batch index",
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
