"""A Transformer-encoder sequence classifier: ``nn.TransformerEncoder``, padding mask, mean pooling.

Token sequences padded with ``PAD``; the padding mask keeps pad tokens out of
attention and out of the mean. Cross-entropy, Adam. Float32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._data import batches

PAD = 0


class TransformerClassifier(nn.Module):
    def __init__(self, vocab_size: int = 20, d_model: int = 16, nhead: int = 2, layers: int = 2,
                 num_classes: int = 3, max_len: int = 10, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(1, max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2 * d_model, dropout=dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pad = tokens == PAD  # (B, T), True where there is no token
        x = self.embed(tokens) + self.pos[:, :tokens.size(1)]
        x = self.encoder(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(1) / keep.sum(1)  # the mean over real tokens only
        return self.head(pooled)


def make_data(n: int = 24, max_len: int = 10, vocab_size: int = 20, num_classes: int = 3, seed: int = 3):
    """Random token rows of random length (the rest PAD); the label is a function of the tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab_size, (n, max_len), generator=g)
    lengths = torch.randint(3, max_len + 1, (n,), generator=g)
    tokens[torch.arange(max_len).expand(n, -1) >= lengths.unsqueeze(1)] = PAD
    labels = (tokens.sum(1) % num_classes)
    return tokens, labels


def train(model: TransformerClassifier, device, steps: int, tokens: torch.Tensor, labels: torch.Tensor, *,
          batch_size: int = 8, lr: float = 3e-3):
    model.to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for x, y in batches(tokens, labels, batch_size=batch_size, steps=steps):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model
