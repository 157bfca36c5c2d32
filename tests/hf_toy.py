"""Tiny Hugging Face models taken as they are, for the tests of issue 24: configs naming
``transformers.GPT2LMHeadModel`` / ``transformers.ViTForImageClassification`` by import path, and
two small registered datasets of dict samples in the shapes those models' forwards take."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from distributed_runner.core.registry import DATASETS

VOCAB, CONTEXT = 64, 16

GPT2 = dict(type="transformers.GPT2LMHeadModel",
            config=dict(type="transformers.GPT2Config", n_layer=2, n_embd=32, n_head=2,
                        vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.0))
VIT = dict(type="transformers.ViTForImageClassification",
           config=dict(type="transformers.ViTConfig", image_size=16, patch_size=4, hidden_size=32,
                       num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       num_labels=10))


@DATASETS.register_module(force=True)
class HFToyTokens(Dataset):
    """``n`` token sequences with a learnable rule (each token is the previous one + 1, mod the
    vocabulary, from a random start): ``input_ids`` and ``labels`` (the same ids; the model
    shifts them itself)."""

    def __init__(self, n: int = 32, context: int = CONTEXT, vocab: int = VOCAB,
                 seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (start + torch.arange(context)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@DATASETS.register_module(force=True)
class HFToyImages(Dataset):
    """``n`` 3x16x16 images of 10 classes, each class a constant brightness plus noise, so a
    tiny classifier learns them: ``pixel_values`` and ``labels``."""

    def __init__(self, n: int = 40, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.arange(n) % 10
        base = (self.labels.float() / 4.5 - 1.0).view(n, 1, 1, 1)
        self.pixels = base + 0.1 * torch.randn(n, 3, 16, 16, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.pixels[i], "labels": self.labels[i]}


def gpt2_cfg(work_dir: Path | str, **overrides: Any) -> dict:
    """A small GPT-2 run: 32 sequences, batch 4 (8 iterations an epoch), 2 epochs, AdamW,
    a checkpoint every epoch, no validation."""
    cfg: dict[str, Any] = dict(
        work_dir=str(work_dir), run_name=".", model=GPT2,  # the test's folder is the run's
        train_dataloader=dict(dataset=dict(type="HFToyTokens", n=32), batch_size=4,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=3e-3)),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=4, sinks=["jsonl"]),
                           checkpoint=dict(type="CheckpointHook", interval=1)),
        randomness=dict(seed=0), log_level="WARNING")
    cfg.update(overrides)
    return cfg
