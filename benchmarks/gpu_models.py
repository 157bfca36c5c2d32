"""The two models of ``gpu_throughput.py`` and their per-sample synthetic datasets.

Written here rather than taken from torchvision/transformers so that the benchmark needs nothing
beyond torch (CI runs it on a CPU in a reduced size). The shapes are the published ones:
ResNet-50 is the bottleneck network of He et al. (3, 4, 6, 3 blocks, widths 64..512, expansion
4, 25.6 M parameters at 1000 classes); ``GPT`` at its default size is GPT-2 small (12 layers,
width 768, 12 heads, context 1024, vocabulary 50257, tied embeddings, 124 M parameters).
Both follow the Runner's model contract: ``forward(..., mode='loss')`` returns ``{'loss': ...}``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.shortcut = None
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    """ResNet-50 with the defaults; ``base`` and ``blocks`` shrink it for the CPU smoke run."""

    def __init__(self, num_classes: int = 1000, base: int = 64,
                 blocks: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(base), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        layers, in_ch = [], base
        for stage, count in enumerate(blocks):
            width = base * 2 ** stage
            for i in range(count):
                layers.append(Bottleneck(in_ch, width, 2 if i == 0 and stage > 0 else 1))
                in_ch = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None,
                mode: str = "predict"):
        x = self.layers(self.stem(inputs))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        return logits


class Block(nn.Module):
    """Pre-norm transformer block with causal attention (PyTorch's fused SDPA kernels)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-2 small with the defaults: next-token loss over ``tokens``."""

    def __init__(self, vocab: int = 50257, context: int = 1024, width: int = 768,
                 layers: int = 12, heads: int = 12) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2

    def forward(self, tokens: torch.Tensor, mode: str = "predict"):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(inputs.shape[1], device=tokens.device)
        logits = self.head(self.ln(self.blocks(self.tok(inputs) + self.pos(positions))))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten())}
        return logits


class SyntheticImages(Dataset):
    """``n`` per-sample ``{'inputs': [3, size, size], 'labels': []}`` held on ``device``: the
    Runner's sampler and collate run as for any dataset, without a host-to-device copy."""

    def __init__(self, n: int, size: int, classes: int, device: torch.device) -> None:
        g = torch.Generator(device="cpu").manual_seed(0)
        self.images = torch.randn(n, 3, size, size, generator=g).to(device)
        self.labels = torch.randint(0, classes, (n,), generator=g).to(device)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"inputs": self.images[i], "labels": self.labels[i]}


class SyntheticTokens(Dataset):
    """``n`` per-sample ``{'tokens': [context + 1]}`` token sequences held on ``device``."""

    def __init__(self, n: int, context: int, vocab: int, device: torch.device) -> None:
        g = torch.Generator(device="cpu").manual_seed(0)
        self.tokens = torch.randint(0, vocab, (n, context + 1), generator=g).to(device)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"tokens": self.tokens[i]}
