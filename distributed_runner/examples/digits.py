"""scikit-learn's bundled 8x8 digits (1,797 images, no download) and a small CNN for them.

Used by ``configs/digits_cnn.py`` through ``custom_imports``. Needs ``scikit-learn`` (the
``examples`` extra).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from distributed_runner.core.registry import DATASETS, MODELS


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 ``[N, 1, 8, 8]`` scaled to [0, 1], labels as int64 ``[N]``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the digits example needs scikit-learn: pip install 'distributed-runner[examples]'"
        ) from e
    data = load_digits()
    images = (data.images.astype(np.float32) / 16.0)[:, None]
    return images, data.target.astype(np.int64)


@DATASETS.register_module()
class DigitsDataset(Dataset):
    """A fixed train/val split of the digits: ``split='train'`` (80 %) or ``'val'`` (20 %).

    The split is a permutation seeded by ``split_seed`` — the same on every rank and every run.
    Items are ``{'inputs': [1, 8, 8] float tensor, 'labels': int}``; ``inputs_key`` renames the
    images' key for a model called with the batch as keyword arguments (a Hugging Face image
    classifier takes ``pixel_values``).
    """

    def __init__(
        self,
        split: str = "train",
        val_fraction: float = 0.2,
        split_seed: int = 0,
        inputs_key: str = "inputs",
    ) -> None:
        if split not in ("train", "val", "all"):
            raise ValueError(f"split must be 'train', 'val' or 'all', got {split!r}")
        images, labels = load_digits_arrays()
        order = np.random.default_rng(split_seed).permutation(len(labels))
        n_val = round(len(labels) * val_fraction)
        keep = {"train": order[n_val:], "val": order[:n_val], "all": order}[split]
        self.images = torch.from_numpy(images[keep])
        self.labels = torch.from_numpy(labels[keep])
        self.inputs_key = inputs_key

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> dict:
        return {self.inputs_key: self.images[idx], "labels": self.labels[idx]}


@MODELS.register_module()
class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, a pooling step and two linear layers (~30k parameters)."""

    def __init__(self, width: int = 16, num_classes: int = 10, dropout: float = 0.1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 16, 64)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(
        self, inputs: torch.Tensor, labels: torch.Tensor | None = None, mode: str = "predict"
    ) -> dict | torch.Tensor:
        if inputs.dim() == 2:  # flat 64-pixel rows (the Parquet copy of the data)
            inputs = inputs.view(-1, 1, 8, 8)
        x = F.relu(self.bn1(self.conv1(inputs)))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        logits = self.fc2(self.drop(F.relu(self.fc1(x.flatten(1)))))
        if mode == "loss":
            if labels is None:
                raise ValueError("DigitsCNN: mode='loss' needs labels (the dataset's 'labels')")
            return {"loss": F.cross_entropy(logits, labels)}
        return logits
