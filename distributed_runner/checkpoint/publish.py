"""CheckpointHook's published checkpoints: one deployable file with only the keys asked for.

A training checkpoint holds what resuming needs (optimizer, schedulers, random states...); a
published one holds ``published_keys`` only (at least the weights), its name ending with the
first 8 hex digits of its SHA-256 so a copy can be checked against its name, as MMEngine's
``publish_model`` does. A sharded (FSDP) checkpoint is gathered into one file, the averaged
weights (EMA) taking the place of the training ones, as MMEngine's layout deploys them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from distributed_runner.checkpoint.files import atomic_save, checksum_path, load_file
from distributed_runner.checkpoint.sharded import SHARDED, full_weights
from distributed_runner.core.errors import argument_errors


def publish_checkpoint(path: Path, keys: Sequence[str]) -> Path:
    """Write ``path`` with only ``keys`` as ``{stem}-{sha256[:8]}.pth`` beside it (atomically,
    with its checksum file); returns the new file."""
    with argument_errors():  # raised at after_train: the dispatcher names the config key
        ckpt = load_file(path, "published_keys")
    if SHARDED in ckpt and "state_dict" in keys:
        ckpt["state_dict"] = full_weights(path, ckpt)  # one deployable file from the shards
        average = ckpt.get("ema_state_dict", {})  # deploy the average, as MMEngine's layout
        ckpt["state_dict"].update(
            {k: average[f"module.{k}"] for k in ckpt["state_dict"] if f"module.{k}" in average}
        )
    slim = {k: ckpt[k] for k in keys if k in ckpt}
    tmp = atomic_save(slim, path.with_name(f"{path.stem}.publishing"))
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()[:8]
    final = path.with_name(f"{path.stem}-{digest}.pth")
    os.replace(tmp, final)
    os.replace(checksum_path(tmp), checksum_path(final))
    return final
