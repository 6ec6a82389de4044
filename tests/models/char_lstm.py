"""A character-level LSTM language model, in the style of the classic word-language-model example.

Two-layer ``nn.LSTM``; ``init_hidden`` makes the state with ``weight.new_zeros`` so it
lands wherever the weights are; the state is detached between batches (truncated
back-propagation); the update is the manual ``p.data.add_(p.grad, alpha=-lr)``
after ``clip_grad_norm_``. Float32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

TEXT = "the quick brown fox jumps over the lazy dog; a lazy dog sleeps while the quick fox runs. " * 3


class CharLSTM(nn.Module):
    def __init__(self, vocab_size: int, emb: int = 12, hidden: int = 16, layers: int = 2, dropout: float = 0.2):
        super().__init__()
        self.hidden, self.layers = hidden, layers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, emb)
        self.rnn = nn.LSTM(emb, hidden, layers, dropout=dropout)
        self.decoder = nn.Linear(hidden, vocab_size)

    def forward(self, input: torch.Tensor, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output))
        return F.log_softmax(decoded, dim=-1), hidden

    def init_hidden(self, batch_size: int):
        weight = next(self.parameters())
        return (weight.new_zeros(self.layers, batch_size, self.hidden),
                weight.new_zeros(self.layers, batch_size, self.hidden))


def encode(text: str = TEXT) -> tuple[torch.Tensor, int]:
    """The text as a LongTensor of character ids, and the vocabulary size."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(chars)


def batchify(data: torch.Tensor, batch_size: int, device) -> torch.Tensor:
    """(length,) -> (length // batch_size, batch_size): each column an independent stream."""
    n = data.size(0) // batch_size
    return data[:n * batch_size].view(batch_size, -1).t().contiguous().to(device)


def repackage_hidden(h):
    """Cut the graph between batches; the values carry over."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def train(model: CharLSTM, device, steps: int, data: torch.Tensor, *, batch_size: int = 4, bptt: int = 10,
          lr: float = 2.0, clip: float = 0.25):
    model.to(device)
    model.train()
    source = batchify(data, batch_size, device)
    hidden = model.init_hidden(batch_size)
    losses = []
    for step in range(steps):
        i = (step * bptt) % (source.size(0) - 1 - bptt)
        x, y = source[i:i + bptt], source[i + 1:i + 1 + bptt].reshape(-1)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(x, hidden)
        loss = F.nll_loss(output.view(-1, output.size(-1)), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses, model
