"""``model=dict(type='HFModel', path=DIR)``: the model a Hugging Face directory describes,
built from its ``config.json`` alone — the shorter form of
``dict(type='transformers.AutoModelForCausalLM.from_config', config=dict(type=
'transformers.AutoConfig.from_pretrained', pretrained_model_name_or_path=DIR))``, and one that
takes a remote directory too (``s3://...``, through pyarrow: transformers reads local folders and
the Hub only; its ``config.json`` is read from there, ``backend_args`` being
``pyarrow.fs.S3FileSystem``'s options). The weights are ``load_from``'s business
(:mod:`distributed_runner.checkpoint.hf`).

A built-in of ``MODELS``: the name resolves wherever the registry is, the Ray driver included,
without importing the checkpoint code.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.redact import redact_url
from distributed_runner.core.registry import MODELS
from distributed_runner.core.storage import is_remote, open_filesystem

CONFIG = "config.json"  # all that from_config needs of the directory
AUTO_CLASSES = (
    "AutoModelForCausalLM",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForMaskedLM",
    "AutoModel",
)


@MODELS.register_module(name="HFModel")
def hf_model(
    path: str,
    auto_class: str = "AutoModelForCausalLM",
    backend_args: dict | None = None,
    **config_overrides: Any,
) -> Any:
    """The ``auto_class`` model of the directory ``path`` (local or a URI), untrained;
    ``config_overrides`` change its config (``num_labels=3``, ``use_cache=False``)."""
    import transformers

    if auto_class not in AUTO_CLASSES:
        raise ArgumentError(
            "auto_class", f"got {auto_class!r}; takes one of {', '.join(AUTO_CLASSES)}"
        )
    if is_remote(path):
        with tempfile.TemporaryDirectory(prefix="drun-hf-config-") as scratch:
            _fetch_config(str(path), backend_args, Path(scratch))
            config = transformers.AutoConfig.from_pretrained(scratch, **config_overrides)
        config.name_or_path = str(path)  # not the scratch folder, gone now
    else:
        folder = Path(path).expanduser().resolve()
        if not (folder / CONFIG).is_file():
            raise ArgumentError(
                "path", f"{folder} has no {CONFIG}: is it a Hugging Face model directory?"
            )
        config = transformers.AutoConfig.from_pretrained(str(folder), **config_overrides)
    return getattr(transformers, auto_class).from_config(config)


def _fetch_config(uri: str, backend_args: dict | None, folder: Path) -> None:
    """The remote directory's ``config.json``, copied into ``folder``; one line naming ``path``
    when the directory or its config is not there."""
    import pyarrow.fs as pafs

    fs, root = open_filesystem(uri, backend_args, key="path")
    try:
        directory, config = fs.get_file_info([root, f"{root}/{CONFIG}"])
        if config.type != pafs.FileType.File:
            if directory.type == pafs.FileType.NotFound:
                raise ArgumentError("path", f"{redact_url(uri)} does not exist: check the path")
            raise ArgumentError(
                "path", f"{redact_url(uri)} has no {CONFIG}: is it a Hugging Face model directory?"
            )
        with fs.open_input_stream(f"{root}/{CONFIG}") as src:
            (folder / CONFIG).write_bytes(src.read())
    except OSError as e:
        raise ArgumentError(
            "path", f"cannot read {redact_url(uri)}: {str(e).splitlines()[0][:200]}"
        ) from None
