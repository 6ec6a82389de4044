"""An ``LSTMCell`` sequence model that learns sine waves, trained with L-BFGS through a closure.

Unlike the other models, ``train`` builds its working copy and its data inside
``with torch.device(device):`` (parameters created where they will live, then
loaded from the CPU model) instead of moving them. Float64 throughout, as the
classic time-sequence example does: L-BFGS's line search amplifies rounding.
"""

from __future__ import annotations

import torch
from torch import nn


class SineLSTM(nn.Module):
    def __init__(self, hidden: int = 12):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        n = input.size(0)
        h1, c1, h2, c2 = (torch.zeros(n, self.hidden, dtype=input.dtype, device=input.device) for _ in range(4))
        outputs = []
        output = None
        for input_t in input.split(1, dim=1):
            h1, c1 = self.lstm1(input_t, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            output = self.linear(h2)
            outputs.append(output)
        for _ in range(future):  # keep predicting from our own outputs
            h1, c1 = self.lstm1(output, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            output = self.linear(h2)
            outputs.append(output)
        return torch.cat(outputs, dim=1)


def sine_waves(n: int = 4, length: int = 10) -> torch.Tensor:
    """``n`` sine waves, each with its own phase, sampled at ``length`` points (on the current device)."""
    t = torch.arange(length, dtype=torch.float64)
    phase = torch.linspace(0.0, 3.0, n, dtype=torch.float64).unsqueeze(1)
    return torch.sin(t / 2.0 + phase)


def train(model: SineLSTM, device, steps: int, *, max_iter: int = 3):
    with torch.device(device):
        seq = SineLSTM(model.hidden).double()
        waves = sine_waves()
    seq.load_state_dict(model.state_dict())  # CPU values copied into parameters that live on `device`
    input, target = waves[:, :-1], waves[:, 1:]
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=max_iter, line_search_fn="strong_wolfe")
    losses = []

    def closure():
        optimizer.zero_grad()
        loss = criterion(seq(input), target)
        loss.backward()
        losses.append(loss.item())
        return loss

    for _ in range(steps):
        optimizer.step(closure)
    with torch.no_grad():
        future = seq(input, future=3)
        losses.append(criterion(future[:, :-3], target).item())
    return losses, seq
