"""Which checkpoint a run starts from: the one module that decides it.

* :func:`choose_run`: which run folder under ``work_dir`` a start writes to (``--resume``: the
  newest run that has a checkpoint, continued in place; else a new one);
* :func:`choose_start`: the Runner's start — ``resume=PATH``, ``resume=True``, ``load_from``;
* :func:`newest_everywhere`: what a rollback (NonFiniteLossHook policy='rollback') restores;
* :func:`choose_restart`: what a Ray worker group (re)started by Ray Train resumes from;
* :func:`newest_verified`: what a sweep trial restarted without Tune's checkpoint continues from;
* :func:`file_of_reported`: the checkpoint file in a folder Ray hands back (a restarted group,
  the asynchronous validation task);
* :func:`is_training_checkpoint`: what counts as a training checkpoint (not weights only), as the
  table of parts (:mod:`.parts`) says;
* :func:`checkpoint_file_of`: the checkpoint file a path names, in any form a user holds one (the
  ``.pth``, a run's folder, a sharded checkpoint's ``.dcp`` folder, Ray's copy), for ``resume``
  (:func:`resume_path`), ``load_from`` (``drun test --checkpoint``) and ``drun export``.

``resume=True`` (``drun train --resume``), so that resuming never loses work and never trusts a
damaged file:

1. the checkpoint ``work_dir/last_checkpoint`` names, if it loads and verifies;
2. else the newest training checkpoint in ``work_dir`` that does (newest by the iteration in its
   meta, then by modification time) — a dangling, empty or binary pointer, or a pointer to a
   truncated or bit-rotten file, falls back here, and the log says what was skipped and why;
3. if checkpoints exist but none verifies: a one-line error. A run that has checkpoints is never
   silently started over (before, a broken pointer restarted from iteration 0 and overwrote them);
4. no checkpoint at all: start fresh (the first run of ``--resume`` scripts).

An explicit ``resume=PATH`` is not second-guessed: that file (or the one a folder names:
:func:`checkpoint_file_of`), verified, or a one-line error.
A rollback takes the same rule's choice (rank 0 reads, every rank gets it). A Ray restart takes
Ray's checkpoint, or a newer one already persisted under the run's storage that verifies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from distributed_runner.checkpoint.files import (
    LAST_CHECKPOINT_POINTER,
    CheckpointDamaged,
    load_file,
    peek,
    peek_meta,
    read_pointer,
)
from distributed_runner.checkpoint.parts import missing_for_training, saved_mesh
from distributed_runner.checkpoint.sharded import SHARDED, manifest_of
from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.run_folders import (
    check_run_name,
    new_run_name,
    run_name_of,
    runs_newest_first,
)
from distributed_runner.core.storage import is_remote
from distributed_runner.data.world_change import sample_position


def is_training_checkpoint(ckpt: Any) -> bool:
    """A training state (:data:`~.parts.TRAINING_REQUIRES`: its ``meta`` and weights, in the file
    or its shards), not weights only."""
    return missing_for_training(ckpt) is None


def require_training_checkpoint(ckpt: dict, path: str | Path) -> None:
    """A one-line ConfigError naming ``resume`` when ``ckpt`` is not a training checkpoint."""
    missing = missing_for_training(ckpt)
    if missing is not None:
        raise ConfigError(
            "resume",
            f"{path} has no {missing!r}: it is a weights file, not a "
            f"training checkpoint; use load_from= for weights",
        )


def ranked_checkpoints(paths: Iterable[Path]) -> list[tuple[int, Path]]:
    """(iteration, path) of the ``paths`` that may hold a training state, newest first (by the
    iteration in their meta, then by modification time). Reading the meta maps the file, no
    tensor is read. Files that do not even open rank last, at iteration -1, so they are tried —
    and reported — after every readable one. Weights-only files are left out."""
    ranked = []
    for path in paths:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - unreadable: a candidate that will be reported
            ranked.append((-1, path.stat().st_mtime, path))
            continue
        if is_training_checkpoint(ckpt):
            ranked.append((int(ckpt["meta"].get("iter", -1)), path.stat().st_mtime, path))
    ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
    return [(iteration, path) for iteration, _, path in ranked]


def checkpoint_files(folder: Path) -> list[Path]:
    """The ``*.pth`` files in ``folder`` that may hold a training state, newest first
    (:func:`ranked_checkpoints`)."""
    return [path for _, path in ranked_checkpoints(folder.glob("*.pth"))]


def _pointer_note(folder: Path, target: Path | None) -> str | None:
    pointer = folder / LAST_CHECKPOINT_POINTER
    if not pointer.exists():
        return None
    if target is None:
        return (
            f"{LAST_CHECKPOINT_POINTER} names no checkpoint file (dangling, empty, binary "
            f"or a folder)"
        )
    return None


def choose_checkpoint(
    folder: str | Path, logger: logging.Logger, key: str = "resume"
) -> tuple[Path, dict] | tuple[None, None]:
    """(path, loaded checkpoint) to resume from, or (None, None) when ``folder`` has none; see
    the module docstring. Raises a one-line ConfigError when checkpoints exist but none
    verifies."""
    folder = Path(folder)
    target = read_pointer(folder)
    skipped: list[str] = []
    note = _pointer_note(folder, target)
    if note:
        skipped.append(note)
    order = ([target] if target else []) + [p for p in checkpoint_files(folder) if p != target]
    for path in order:
        try:
            ckpt = load_file(path, key)
        except CheckpointDamaged as e:
            skipped.append(f"{path.name}: {str(e).split(': ', 1)[-1]}")
            continue
        if not is_training_checkpoint(ckpt):
            skipped.append(f"{path.name}: weights only, no training state")
            continue
        if skipped:
            logger.warning(
                "resume: %s; resuming from %s (iter %s), the newest checkpoint in %s that verifies",
                "; ".join(skipped),
                path.name,
                ckpt["meta"].get("iter"),
                folder,
            )
        return path, ckpt
    if order:
        raise ConfigError(
            key,
            f"{folder} has checkpoints but none verifies ({'; '.join(skipped)})"
            f": pass --resume PATH of a good one, or move them away to start "
            f"over",
        )
    if note:
        logger.warning("resume: %s and %s holds no checkpoint: starting fresh", note, folder)
    return None, None


def newest_verified(folder: str | Path, logger: logging.Logger) -> Path | None:
    """The checkpoint of ``folder`` a run would resume from (:func:`choose_checkpoint`: the
    pointer's file if it verifies, else the newest that does), or None when there is none or
    none verifies (said on ``logger``) — for callers that continue without one."""
    try:
        return choose_checkpoint(folder, logger)[0]
    except ConfigError as e:
        logger.warning("%s", e)
        return None


def file_of_reported(folder: str | Path, where: Any) -> Path:
    """The one checkpoint file in a checkpoint folder reported to Ray (``ray.train.report``
    uploads the saved file alone); ``where`` names it in the error when there is not one."""
    files = sorted(Path(folder).glob("*.pth"))
    if len(files) != 1:
        raise RuntimeError(f"Ray checkpoint {where} holds {len(files)} .pth files, expected one")
    return files[0]


CHECKPOINT_FORMS = (
    "a checkpoint file (.pth), a run's folder (it holds last_checkpoint), a sharded "
    "checkpoint's <name>.<token>.dcp folder or Ray's copy of a checkpoint "
    "(work_dir/ray_storage/<run>/<name>-<time>)"
)
MODEL_DIRECTORY = (
    "a model directory (config.json with model.safetensors or its index, as save_pretrained writes)"
)


def checkpoint_file_of(path: str | os.PathLike, key: str, model_dir: bool = False) -> Path:
    """The checkpoint file ``path`` names, in whichever form a user holds one: the file itself;
    a run's folder (the file its ``last_checkpoint`` names); a sharded checkpoint's ``.dcp``
    folder (the manifest beside it, which names it); Ray's copy of a checkpoint (the folder
    ``Result.checkpoint.path`` gives: the one ``.pth`` in it, beside its checksum and shards).

    Why one resolver: ``resume``, ``load_from``, ``drun test --checkpoint`` and ``drun export``
    take the same forms, and each then loads that one file, so every form ends exactly where
    its ``.pth`` would (a manifest finds its shards beside itself). Anything else is a one-line
    ConfigError naming ``key`` and what to pass (``model_dir``: ``key`` takes a Hugging Face model
    directory too, which the caller has recognised before: ``load_from``, where
    :func:`~distributed_runner.checkpoint.hf.directory.pretrained_source` says so; this module
    sits below ``hf``). Nothing is verified here: the load does that."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if not p.is_dir():  # named as given: a URI (s3://...) is not a local Path's text
        raise ConfigError(key, f"checkpoint {str(path)!r} does not exist: check the path")
    if p.suffix == ".dcp":
        return _manifest_naming(p, key)
    return _file_in_folder(p, key, model_dir)


def _manifest_naming(shards: Path, key: str) -> Path:
    """The manifest of the shard folder ``shards`` — only if it names that folder: shards left
    by an earlier save of the same name are not what the manifest holds now."""
    manifest = manifest_of(shards)
    if not manifest.is_file():
        raise ConfigError(
            key,
            f"{shards} is a sharded checkpoint's folder without its manifest {manifest.name} "
            f"beside it (a save cut short, or a copy of the folder alone): copy the manifest "
            f"and its .crc32 next to it, or pass another checkpoint",
        )
    named = peek(manifest)  # {} when unreadable: the load then says how it is damaged
    entry = named.get(SHARDED)
    if named and (not isinstance(entry, dict) or entry.get("dir") != shards.name):
        raise ConfigError(
            key,
            f"{manifest} does not hold the shards in {shards.name} (they are left from an "
            f"earlier save of that name): pass {manifest}",
        )
    return manifest


def _file_in_folder(folder: Path, key: str, model_dir: bool) -> Path:
    """A run's folder: the file its ``last_checkpoint`` names; a folder holding one checkpoint
    (Ray's copy, which has no pointer): that file."""
    pointed = read_pointer(folder)
    if pointed is not None:
        return pointed
    files = sorted(folder.glob("*.pth"))
    if files and (folder / LAST_CHECKPOINT_POINTER).exists():
        raise ConfigError(
            key,
            f"{folder / LAST_CHECKPOINT_POINTER} names no checkpoint file (dangling, empty, "
            f"binary or a folder): pass one of the folder's checkpoint files (.pth)",
        )
    if len(files) == 1:
        return files[0]
    if files:
        raise ConfigError(
            key,
            f"{folder} holds {len(files)} checkpoints and no {LAST_CHECKPOINT_POINTER} to "
            f"choose one: pass one of them (.pth)",
        )
    what = f"neither a checkpoint nor {MODEL_DIRECTORY}" if model_dir else "no checkpoint"
    also = ", or a model directory" if model_dir else ""
    raise ConfigError(key, f"{folder} is a folder but {what}: pass {CHECKPOINT_FORMS}{also}")


def resume_path(resume: Any) -> Any:
    """``resume`` as the Runner takes it: a path as the checkpoint file it names
    (:func:`checkpoint_file_of`, key ``resume``), so that ``--resume`` takes every form a user
    holds, and one that names none (a URI among them: no local file) is one line here; True,
    False and '' as given."""
    if isinstance(resume, (str, Path)) and str(resume):
        return str(checkpoint_file_of(resume, "resume"))
    return resume


def _named_file(resume: str | Path) -> Path:
    """The file a ``resume`` path names, or the path as given when it names none (the Runner
    reports that; the run's folder is chosen first, maybe where the path cannot be seen)."""
    try:
        return checkpoint_file_of(resume, "resume") if str(resume) else Path(resume)
    except ConfigError:
        return Path(resume).expanduser()


def has_checkpoints(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint file or a pointer to one (verified or not: a run
    whose checkpoints are all damaged is still the run ``--resume`` means, and says so)."""
    return (folder / LAST_CHECKPOINT_POINTER).exists() or any(folder.glob("*.pth"))


def choose_run(work_dir: str | Path, run_name: str | None, resume: Any) -> str:
    """The run folder (its name under ``work_dir``) a start writes to.

    A ``run_name`` the config gives is that run (a one-line ConfigError when it cannot name a
    folder). Else: ``resume=PATH`` in a run folder of ``work_dir`` continues that run;
    ``resume=True`` the most recently active run that has a checkpoint (:func:`choose_start` then
    takes its newest that verifies); anything else is a new run
    (:func:`~distributed_runner.core.run_folders.new_run_name`, which creates its folder). A
    choice is made once per run (rank 0, or the Ray driver) and handed on."""
    if run_name is not None:
        problem = check_run_name(str(run_name))
        if problem:
            raise ConfigError("run_name", problem)
        return str(run_name)
    work_dir = Path(work_dir).expanduser().resolve()
    if isinstance(resume, (str, Path)):  # its file's folder: a run's folder names its own file
        folder = _named_file(resume).expanduser().resolve().parent
        if folder == work_dir or folder.parent == work_dir:
            return run_name_of(work_dir, folder)
        return new_run_name(work_dir)
    if resume:
        for run in runs_newest_first(work_dir):
            if has_checkpoints(run):
                return run_name_of(work_dir, run)
    return new_run_name(work_dir)


def meta_to_resume(resume: Any, run_dir: Path) -> dict:
    """What the run being resumed fixed before anything is built (``{}``: a fresh start), read
    by rank 0 from the checkpoint's metadata alone and broadcast: its ``seed``, its
    ``global_batch`` (samples of one iteration over all data-parallel ranks), its ``mesh``, a
    streamed run's ``num_streams`` (the order's ``C``), its configured ``batch_size`` and its
    data pass's sample position (``samples``).

    Why before anything is built: the samplers order every epoch by ``seed + epoch``, so a run
    whose config draws a new seed (no ``randomness.seed``) must take the one it was started
    with, or the resumed epoch visits other samples (MMEngine's resume adopts it as well); and a
    resume at another world size keeps the global batch (data/world_change.py), which fixes how
    the training loader is cut and the length of an epoch."""
    found: dict = {}
    if dist.get_rank() == 0:
        path = (
            Path(resume).expanduser()
            if isinstance(resume, (str, Path))
            else (_newest_checkpoint(run_dir) if resume else None)
        )
        meta = peek_meta(path) if path is not None else {}
        if meta:
            found = {"seed": meta.get("seed"), "global_batch": meta.get("global_batch")}
            found["num_streams"] = meta.get("num_streams")  # a streamed run's order
            found["mesh"] = saved_mesh(meta)
            # a batch_size edited for the resume asks for a new global batch from this sample
            found["batch_size"] = meta.get("batch_size")
            found["samples"] = sample_position(meta)
    return dist.broadcast_object(found)


def _newest_checkpoint(run_dir: Path) -> Path | None:
    """``last_checkpoint``'s file, else the newest training checkpoint (:func:`checkpoint_files`'
    ranking): the seed is the run's, whichever of its checkpoints resume then verifies."""
    pointed = read_pointer(run_dir)
    if pointed is not None or not Path(run_dir).is_dir():
        return pointed
    return next(iter(checkpoint_files(Path(run_dir))), None)


def parse_load_from(spec: Any) -> tuple[str | None, bool]:
    """``load_from`` as (path, strict): a path (a checkpoint file, or a Hugging Face model
    directory, local or a URI), or ``dict(path=..., strict=False)`` where the files may lack
    some of the model's tensors (a new head: initialised) or hold more (left out)."""
    if spec is None or spec == "":
        return None, True
    if isinstance(spec, (str, Path)):
        return str(spec), True
    if isinstance(spec, dict) and set(spec) <= {"path", "strict"} and "path" in spec:
        if not isinstance(spec.get("strict", True), bool):
            raise ConfigError("load_from.strict", f"got {spec['strict']!r}; takes True or False")
        return str(spec["path"]), bool(spec.get("strict", True))
    raise ConfigError(
        "load_from",
        f"got {spec!r:.80}; takes a path or dict(path=..., strict=False)",
    )


class StartChoice(NamedTuple):
    """How a Runner starts: ``purpose`` 'resume' (the whole training state), 'load_from'
    (weights) or None (fresh); ``checkpoint`` is the file already read and verified, if it was."""

    purpose: str | None
    path: str | Path | None
    checkpoint: dict | None


def choose_start(
    load_from: Any, resume: Any, work_dir: Path, logger: logging.Logger
) -> StartChoice:
    """``resume='path'`` (that file, no second-guessing), else ``resume=True`` (the newest
    checkpoint of ``work_dir`` that verifies; none yet: start fresh), else ``load_from``."""
    if isinstance(resume, (str, Path)):
        return StartChoice("resume", resume, None)
    if resume:
        path, ckpt = choose_checkpoint(work_dir, logger)
        if path is not None:
            return StartChoice("resume", path, ckpt)
        logger.info("resume=True but %s has no checkpoint yet: starting fresh", work_dir)
    if load_from:
        return StartChoice("load_from", load_from, None)
    return StartChoice(None, None, None)


def newest_everywhere(
    work_dir: Path, logger: logging.Logger, rank: int, reason: str
) -> tuple[dict, str]:
    """What a rollback restores: :func:`choose_checkpoint`'s choice and its path on every rank
    (rank 0 reads the file and broadcasts it, so ranks on other machines need not see
    ``work_dir``). Call on every rank."""
    found, ckpt = choose_checkpoint(work_dir, logger, "rollback") if rank == 0 else (None, None)
    path = dist.broadcast_object(str(found or "") if rank == 0 else "")  # rank 0's
    if not path:
        raise FloatingPointError(
            f"cannot roll back ({reason}): no checkpoint saved yet; "
            f"save earlier (default_hooks.checkpoint.interval) or use "
            f"policy='skip'"
        )
    return dist.broadcast_object(ckpt or {}), path  # rank 0 found one: path is not empty


def newest_persisted(storage: str, name: str, than_iter: int) -> Path | None:
    """The newest checkpoint reported under ``storage/name`` that is newer than iteration
    ``than_iter`` and verifies, or None. Ray hands a restarted group the checkpoint its
    controller registered last; a worker killed right after a report can leave a newer one
    persisted there that the controller never learned of. Local (or mounted) storage only."""
    folder = Path(storage) / name
    if is_remote(storage) or not folder.is_dir():
        return None
    for iteration, path in ranked_checkpoints(folder.glob("*/*.pth")):
        if iteration <= than_iter:  # unreadable files rank at -1: never chosen
            break
        try:
            load_file(path, "resume")  # verified against the checksum reported with it
            return path
        except CheckpointDamaged:
            continue  # a torn upload
    return None


def choose_restart(
    restored: str | None, launcher: dict, rank: int
) -> tuple[str | None, str | None]:
    """The checkpoint a (re)started Ray worker group resumes from, the same on every rank, and
    why when it is not ``restored`` (Ray's): a newer one already persisted under the run's
    storage (``launcher.storage_path``/``name``; rank 0 looks, and every rank must be able to
    read it, else Ray's is kept). Call on every rank."""
    newer = None
    if rank == 0 and launcher.get("storage_path") and launcher.get("name"):
        ranked = ranked_checkpoints([Path(restored)]) if restored else []
        ray_iter = ranked[0][0] if ranked else -1
        found = newest_persisted(launcher["storage_path"], launcher["name"], ray_iter)
        newer = str(found) if found is not None else None
    newer = dist.broadcast_object(newer)
    if newer is not None:
        readable = torch.tensor([1 if Path(newer).is_file() else 0])
        if int(dist.all_reduce(readable, "min").item()) == 1:
            handed = Path(restored).name if restored else "no checkpoint"
            return newer, (
                f"Ray handed back {handed}; resuming from {newer} instead: it is "
                f"newer and verifies (its report had not reached Ray's controller "
                f"when a worker died)"
            )
    return restored, None
