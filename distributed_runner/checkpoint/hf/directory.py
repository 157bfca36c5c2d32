"""A Hugging Face model directory: recognised by its files, indexed by tensor name without
reading a tensor, fetched once per machine when it lives in object storage."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.storage import is_remote, open_filesystem

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# what sits beside the weights and a served model needs too (copied by export)
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)


def cache_root() -> Path:
    """Where remote directories are copied: ``DRUN_PRETRAINED_CACHE``, else the user's cache."""
    return Path(
        os.environ.get("DRUN_PRETRAINED_CACHE", "~/.cache/distributed_runner/pretrained")
    ).expanduser()


def is_pretrained_dir(path: Any) -> bool:
    """Whether ``path`` is a ``save_pretrained`` directory: ``config.json`` and safetensors
    weights (one file, or shards with their index). A remote URI counts when it names no
    ``.pth`` file (it is checked when fetched)."""
    if path is None or isinstance(path, bool):
        return False
    if is_remote(path):
        return not str(path).rstrip("/").lower().endswith(".pth")
    folder = Path(path).expanduser()
    return folder.is_dir() and (folder / CONFIG).is_file() and weight_files(folder) != []


def pretrained_source(load_from: Any) -> str | None:
    """``load_from`` when it names a model directory — absolute, or the URI — else None."""
    if not load_from or not is_pretrained_dir(load_from):
        return None
    return str(load_from) if is_remote(load_from) else str(Path(load_from).expanduser().resolve())


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files the index names (or the single ``model.safetensors``)."""
    index = folder / INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(
                "load_from",
                f"{index} is not a safetensors index (JSON with a weight_map): is the copy whole?",
            ) from None
        return [folder / n for n in names]
    return [folder / SINGLE] if (folder / SINGLE).is_file() else []


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: 'F32', 'BF16' ...
    file: Path


def tensor_index(folder: Path, key: str = "load_from") -> dict[str, TensorInfo]:
    """Every tensor in the directory's weight files by name, from the files' headers only."""
    from safetensors import safe_open

    files = weight_files(folder)
    if not files:
        raise ConfigError(key, f"{folder} holds no {SINGLE} nor {INDEX}: is it a model directory?")
    index: dict[str, TensorInfo] = {}
    for file in files:
        if not file.is_file():
            raise ConfigError(key, f"{folder}/{INDEX} names {file.name}, which is not there")
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                view = f.get_slice(name)
                index[name] = TensorInfo(tuple(view.get_shape()), view.get_dtype(), file)
    return index


def local_directory(path: str, backend_args: dict | None = None, key: str = "load_from") -> Path:
    """``path`` itself when local; a remote directory is copied once per machine into the cache
    (``DRUN_PRETRAINED_CACHE``, default ``~/.cache/distributed_runner/pretrained``): the first
    process to get the lock downloads, the others on the machine wait and reuse its copy."""
    if not is_remote(path):
        folder = Path(path).expanduser().resolve()
        if not is_pretrained_dir(folder):
            raise ConfigError(
                key,
                f"{folder} is not a model directory (config.json and "
                f"safetensors weights, as save_pretrained writes)",
            )
        return folder
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / hashlib.sha256(path.rstrip("/").encode()).hexdigest()[:16]
    with open(f"{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / CONFIG).is_file():
            _download(path, target, backend_args, key)
    return target


def _download(uri: str, target: Path, backend_args: dict | None, key: str) -> None:
    """Every file of the remote directory (not its subfolders) into ``target``, atomically."""
    import pyarrow.fs as pafs

    fs, root = open_filesystem(uri, backend_args, key=key)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    except FileNotFoundError:
        raise ConfigError(key, f"{uri} does not exist: check the path") from None
    except OSError as e:
        raise ConfigError(key, f"cannot list {uri}: {str(e).splitlines()[0]}") from None
    names = {
        Path(i.path).name
        for i in infos
        if i.type == pafs.FileType.File
        and (i.path.endswith(".safetensors") or Path(i.path).name in (CONFIG, INDEX, *SIDE_FILES))
    }  # not *.bin duplicates of the weights, nor anything else a bucket may hold
    if CONFIG not in names or not (SINGLE in names or INDEX in names):
        raise ConfigError(
            key, f"{uri} holds no config.json with safetensors weights: is it a model directory?"
        )
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for name in sorted(names):
        with fs.open_input_stream(f"{root}/{name}") as src, open(partial / name, "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)


def weight_sources_absolute(cfg: dict) -> bool:
    """On the Ray driver: ``load_from`` (a path, or ``dict(path=...)``) and an ``HFModel``'s
    ``path`` made absolute in place (Ray Train runs the workers in another folder). True when
    one is a URI (the workers then get the driver's ``AWS_*`` variables)."""
    remote = False
    holders: list[tuple[dict, str]] = [(cfg, "load_from")]
    if isinstance(cfg.get("load_from"), dict):
        holders = [(cfg["load_from"], "path")]
    model = cfg.get("model")
    if isinstance(model, dict) and model.get("type") == "HFModel" and "path" in model:
        holders.append((model, "path"))
    for holder, key in holders:
        value = holder.get(key)
        if not isinstance(value, (str, Path)) or not str(value):
            continue
        if is_remote(value):
            remote = True
        else:
            holder[key] = str(Path(value).expanduser().resolve())
    return remote
