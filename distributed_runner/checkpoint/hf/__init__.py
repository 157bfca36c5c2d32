"""Hugging Face model directories, in and out: what ``save_pretrained`` writes and
``from_pretrained`` (or vLLM, or the Hub) reads.

* :mod:`.directory` — recognising such a directory (local, or fetched once per machine from a
  remote URI) and indexing its safetensors files by tensor name, reading only their headers.
* :mod:`.names` — which tensor of the model is which name in the files: the model's own
  ``state_dict`` names, less PEFT's wrapping (``base_model.model.``, ``.base_layer``), with the
  base-model prefix added or dropped as ``from_pretrained`` does, tied weights stored once.
* :mod:`.load` — ``load_from=<directory>``: the model is built with its parameters on the meta
  device, sharded, and each rank reads only the slices it holds.
* :mod:`.peft_layers` — LoRA specifics: adapters that no file holds, initialised as PEFT does;
  merging them into the base weights on export.
* :mod:`.export` — ``drun export CHECKPOINT OUT_DIR --format hf``, tensor by tensor.

``model=dict(type='HFModel', path=DIR)``, the model such a directory describes, is a model:
:mod:`distributed_runner.model.hf_model`.
May import: the rest of checkpoint, model, core.
"""
