"""Checkpoint files: atomic writes, safe loads, the ``last_checkpoint`` pointer, RNG capture.

A checkpoint is one dict of tensors and plain containers (so ``torch.load(weights_only=True)`` can
read it without running pickled code). Its parts, as :data:`~.parts.PARTS` declares
them (key, what it holds [when it is there]; a "per rank" part is ``{"ranks": [rank 0's,
rank 1's, ...]}``; a test checks this text against the table)::

    meta               epoch, iter, iter_in_epoch, samples_in_epoch, val_pending, seed,
                       world_size, mesh, global_batch, num_streams, batch_size, experiment_name,
                       time, config (JSON text), versions; the saver's additions: best,
                       async_save, ema_in_state_dict [always]
    state_dict         the model's weights (unwrapped) [unless sharded]
    sharded            the shards' manifest: their folder, keys and files with sizes [sharded
                       FSDP checkpoints; written by the checkpoint writer
                       (checkpoint.sharded.start_shards)]
    rank_slices        this rank's slices of the sharded weights and of the optimizer's state
                       [only in the state a fault-tolerant replica group sends a healing peer,
                       never in a file; written by a replica group's heal
                       (checkpoint.state.collect_rank_state)]
    optimizer          the optimizer's state [with save_optimizer (in the shards if sharded)]
    scaler             the AMP GradScaler's state, or None [when training]
    param_schedulers   one state per scheduler [with save_param_scheduler]
    message_hub        runtime info and scalar histories [always]
    hooks              each stateful hook's state_dict(), keyed by its registered name [always]
    sinks              the log sinks' state (the MLflow run id) [always]
    sampler            per rank: epoch and batches consumed in it; restoring it resumes training
                       at meta's position [always]
    train_data         per rank: where a streamed training set stands: the data and order
                       settings it was built on and, packed, every stream's cursor; any world
                       size restores it [with StreamingLoader]
    rank_buffers       per rank: the model's buffers (BN statistics differ between syncs) [with
                       several ranks]
    accumulated_grads  per rank: gradients of an unfinished accumulation window [saved inside
                       one]
    rng                per rank: python, numpy, torch (and cuda) generator states [always]
    ema_state_dict     the training weights under 'module.' (state_dict then holds the average)
                       or, if sharded, the average [with EMAHook; written by
                       EMAHook.before_save_checkpoint, read by its after_load_checkpoint]

Files are written to a temporary name in the same folder and renamed into place (and the folder
synced), so a crash never leaves a half-written file under a final name. Beside each file, a
checksum (``NAME.pth.crc32``: CRC-32 and size of the file's bytes, computed while writing) lets
every load find bit rot and truncation: :func:`load_file` verifies it on a second thread while
torch reads the file, so verifying costs little wall time. A damaged file is
:class:`CheckpointDamaged` (a one-line ConfigError); a file without a checksum (written by
something else) loads unverified. A write that fails for lack of space is one line too
(:class:`CheckpointWriteError`), and the previous checkpoints stay as they were.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import threading
import warnings
import zlib
from pathlib import Path
from typing import IO, Any, cast

import torch

from distributed_runner.checkpoint.sharded import SHARDED, missing_shards, remove_shards
from distributed_runner.core.errors import CheckpointWriteError, ConfigError
from distributed_runner.model.sharding import is_sharded, load_full_model_state

LAST_CHECKPOINT_POINTER = "last_checkpoint"
CHECKSUM_SUFFIX = ".crc32"
_CHUNK = 16 << 20


class CheckpointDamaged(ConfigError):
    """A checkpoint file that exists but cannot be trusted: unreadable, truncated, or its bytes
    differ from the checksum recorded when it was written."""


class _ChecksumWriter:
    """The file object torch.save writes through: CRC-32 and size of every byte written."""

    def __init__(self, f: Any) -> None:
        self.f, self.crc, self.size = f, 0, 0

    def write(self, data: Any) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def checksum_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file beside ``path``, rename it into place, write its
    checksum beside it and sync the folder (so the rename survives a power cut)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            writer = _ChecksumWriter(f)
            torch.save(obj, cast(IO[bytes], writer))  # it needs write() and flush() only
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        atomic_write_text(
            json.dumps({"crc32": f"{writer.crc:08x}", "size": writer.size}), checksum_path(path)
        )
        _sync_folder(path.parent)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if _out_of_space(e):
            free = shutil.disk_usage(path.parent).free / 2**20
            raise CheckpointWriteError(
                f"no space left on device writing {path.name} in {path.parent} ({free:.0f} MiB "
                f"free); the checkpoints written before it are intact: free space (or lower "
                f"max_keep_ckpts) and resume"
            ) from None
        raise
    return path


def _out_of_space(exc: BaseException | None) -> bool:
    """ENOSPC, also when torch's zip writer reports it as 'unexpected pos' (the OSError is
    its context)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - a platform without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def atomic_write_text(text: str, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def remove_checkpoint(path: str | os.PathLike) -> None:
    """Delete a checkpoint, its checksum and its shards (if sharded)."""
    Path(path).unlink(missing_ok=True)
    checksum_path(path).unlink(missing_ok=True)
    remove_shards(Path(path))


def remove_stale_temporaries(folder: str | os.PathLike) -> tuple[int, int]:
    """Delete the temporaries of checkpoint writes a crash interrupted (``.NAME.pth.*.tmp``);
    returns (files, bytes). Call it before this run writes anything into ``folder``."""
    count = size = 0
    for tmp in Path(folder).glob(".*.pth.*.tmp"):
        try:
            size += tmp.stat().st_size
            tmp.unlink()
            count += 1
        except OSError:
            pass
    return count, size


def _file_crc32(path: Path, out: dict) -> None:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)  # releases the GIL: torch.load runs meanwhile
    out["crc32"] = f"{crc:08x}"


def load_file(
    path: str | os.PathLike, key: str, map_location: Any = "cpu", mmap: bool = False
) -> dict:
    """Load a checkpoint with ``weights_only=True``, verified against its checksum when it has
    one. A missing file is a ConfigError, a damaged one :class:`CheckpointDamaged`; both one
    line naming ``key`` and the file. ``mmap``: tensors stay in the file until read (an export
    reads a model larger than memory a tensor at a time)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(key, f"checkpoint {str(p)!r} does not exist: check the path")
    expected = _recorded_checksum(p)
    size = p.stat().st_size
    if expected is not None and size != expected["size"]:
        raise CheckpointDamaged(
            key,
            f"{str(p)!r} is damaged: {size} bytes, "
            f"{expected['size']} when it was written (truncated?)",
        )
    found: dict = {}
    verifier = (
        threading.Thread(target=_file_crc32, args=(p, found), daemon=True)
        if expected is not None
        else None
    )
    if verifier is not None:
        verifier.start()
    try:
        with warnings.catch_warnings():  # torch's pickle-protocol warning asks to file an issue
            warnings.simplefilter("ignore", UserWarning)
            ckpt = torch.load(p, map_location=map_location, weights_only=True, mmap=mmap)
    # any exception: torch.load raises many types for a damaged file (pickle errors, EOFError,
    # zip errors, RuntimeError for foreign formats); each becomes one CheckpointDamaged
    except Exception as e:  # noqa: BLE001
        raise CheckpointDamaged(
            key,
            f"{str(p)!r} is not a loadable checkpoint "
            f"({_load_error_reason(e)}); pass a .pth written by "
            f"CheckpointHook or torch.save(state_dict)",
        ) from None
    finally:
        if verifier is not None:
            verifier.join()
    if expected is not None and found.get("crc32") != expected["crc32"]:
        raise CheckpointDamaged(
            key,
            f"{str(p)!r} is damaged: its CRC-32 is "
            f"{found.get('crc32')}, {expected['crc32']} when it was "
            f"written (bit rot or an overwrite); it was not loaded",
        )
    if not isinstance(ckpt, dict):
        raise ConfigError(key, f"{str(p)!r} holds a {type(ckpt).__name__}, not a checkpoint dict")
    if SHARDED in ckpt:  # a manifest: its shard files must all be there, whole
        reason = missing_shards(p, ckpt)
        if reason:
            raise CheckpointDamaged(key, f"{str(p)!r} is damaged: {reason}; it was not loaded")
    return ckpt


def peek(path: str | os.PathLike) -> dict:
    """A checkpoint's parts without reading its tensors (the file is memory-mapped, not
    verified); ``{}`` for a file that is missing or unreadable, which loading it later reports
    in full. For choices made before the load: which seed, which shards a manifest names."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ckpt = torch.load(Path(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - any damage: the real load names it
        return {}
    return ckpt if isinstance(ckpt, dict) else {}


def peek_meta(path: str | os.PathLike) -> dict:
    """A checkpoint's ``meta`` without reading its tensors (:func:`peek`); ``{}`` for a file
    that is missing or unreadable, which loading it later reports in full."""
    meta = peek(path).get("meta")
    return meta if isinstance(meta, dict) else {}


def _recorded_checksum(path: Path) -> dict | None:
    try:
        recorded = json.loads(checksum_path(path).read_text())
        return {"crc32": str(recorded["crc32"]), "size": int(recorded["size"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none written (another tool's file), or unreadable: load unverified


def _load_error_reason(exc: Exception) -> str:
    """The informative part of torch's load error: which global a refused pickle wanted, or
    what was wrong with the bytes — never its advice to load with weights_only=False, nor its
    request to file an issue."""
    text = str(exc)
    glob = re.search(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)", text)
    if glob:
        return f"it asks to run code ({glob.group(1)}), which is refused"
    if "Unpickler error" in text or "Unsupported operand" in text:
        return "its pickle holds instructions other than tensors and plain data, which are refused"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] or [type(exc).__name__]
    reason = lines[0]
    for advice in ("Please file an issue", "weights_only", "If you trust"):
        reason = reason.split(advice)[0]
    return reason.strip(" .;,")[:160] or type(exc).__name__


def point_at(path: str | os.PathLike, *folders: str | os.PathLike) -> None:
    """Move the ``last_checkpoint`` pointer in each of ``folders`` to ``path`` (rank 0, once the
    checkpoint is committed). The one writer of the pointer, so that every saver (CheckpointHook,
    a request saved without one) leaves it the same way: relative to its folder, so a work_dir
    moved or copied keeps a pointer that resolves (:func:`read_pointer`)."""
    for folder in dict.fromkeys(Path(f) for f in folders):
        atomic_write_text(os.path.relpath(path, folder), folder / LAST_CHECKPOINT_POINTER)


def read_pointer(folder: str | os.PathLike) -> Path | None:
    """The checkpoint the ``last_checkpoint`` pointer in ``folder`` names, if it exists (the
    pointer holds the name relative to its folder; an absolute one from an older run, or a
    work_dir moved since, is looked up by its name in ``folder`` too). A pointer that is empty,
    binary or names a folder gives None."""
    pointer = Path(folder) / LAST_CHECKPOINT_POINTER
    try:
        text = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text or "\x00" in text:
        return None
    target = Path(text)
    candidates = [target] if target.is_absolute() else [Path(folder) / target]
    candidates.append(Path(folder) / target.name)
    found = next((c for c in candidates if c.is_file()), None)
    return found.resolve() if found is not None else None


def load_weights(
    model: torch.nn.Module, state: dict, key: str, path: str | os.PathLike, strict: bool = True
) -> None:
    """``model.load_state_dict(state)``; a checkpoint of another model is one line naming the
    first tensors that differ (torch's message lists every one, over dozens of lines)."""
    try:
        if is_sharded(model):  # full tensors from the file, sharded into this rank's parts
            load_full_model_state(model, state, strict=strict)
        else:
            model.load_state_dict(state, strict=strict)
    except RuntimeError:
        own = model.state_dict()
        shapes = [
            f"{k} {list(v.shape)} in the checkpoint, {list(own[k].shape)} in the model"
            for k, v in state.items()
            if k in own and hasattr(v, "shape") and tuple(v.shape) != tuple(own[k].shape)
        ]
        missing = [k for k in own if k not in state] if strict else []
        unexpected = [k for k in state if k not in own] if strict else []

        def first(items: list[str], n: int = 3) -> str:
            return "; ".join(items[:n]) + (f"; ... ({len(items)} in all)" if len(items) > n else "")

        parts = (
            ([f"shapes differ: {first(shapes)}"] if shapes else [])
            + ([f"missing in the checkpoint: {first(missing)}"] if missing else [])
            + ([f"not in the model: {first(unexpected)}"] if unexpected else [])
        )
        differences = " | ".join(parts) or "load_state_dict failed"
        raise ConfigError(
            key,
            f"{path} does not fit the model ({differences}): is it a "
            f"checkpoint of this config's model?",
        ) from None


def model_state_from(ckpt: dict) -> dict:
    """The weights in a full checkpoint, or the dict itself if it already is a state_dict."""
    state = ckpt.get("state_dict", ckpt)
    # weights saved from a DDP-wrapped or a torch.compile'd model carry a prefix per wrapper
    for prefix in ("_orig_mod.", "module.", "_orig_mod."):
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def load_state_dict(
    module: Any, state_dict: dict, strict: bool = False, logger: Any = None
) -> None:
    """MMEngine's ``mmengine.runner.checkpoint.load_state_dict``, which downstream hooks call:
    load ``state_dict`` into ``module`` (a DDP wrapper's inner module); keys that do not match
    are an error with ``strict``, else a warning on the run's logger."""
    from distributed_runner.core.log import current_logger
    from distributed_runner.model.build import is_model_wrapper

    module = module.module if is_model_wrapper(module) else module
    result = module.load_state_dict(state_dict, strict=False)
    problems = [
        f"{what}: {', '.join(keys)}"
        for what, keys in (
            ("missing keys", result.missing_keys),
            ("unexpected keys", result.unexpected_keys),
        )
        if keys
    ]
    if problems and strict:
        raise RuntimeError(
            f"state_dict does not fit {type(module).__name__}: {'; '.join(problems)}"
        )
    if problems:
        (logger if hasattr(logger, "warning") else current_logger()).warning(
            "state_dict does not fit %s: %s", type(module).__name__, "; ".join(problems)
        )
