"""``model=dict(type='HFModel', path=DIR)``: the model a Hugging Face directory describes,
built from its ``config.json`` alone — the shorter form of
``dict(type='transformers.AutoModelForCausalLM.from_config', config=dict(type=
'transformers.AutoConfig.from_pretrained', pretrained_model_name_or_path=DIR))``, and one that
takes a remote directory too (``s3://...``: copied once per machine, as ``load_from`` copies it;
transformers reads local folders and the Hub only). The weights are ``load_from``'s business.
"""

from __future__ import annotations

from typing import Any

from distributed_runner.checkpoint.hf.directory import local_directory
from distributed_runner.core.errors import ArgumentError, ConfigError
from distributed_runner.core.registry import MODELS

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
    try:
        folder = local_directory(path, backend_args, key="path")
    except ConfigError as e:  # keyed within the model's config: the registry puts 'model.'
        raise ArgumentError("path", e.message) from None
    config = transformers.AutoConfig.from_pretrained(str(folder), **config_overrides)
    return getattr(transformers, auto_class).from_config(config)
