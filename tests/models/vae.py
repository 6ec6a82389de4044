"""A variational auto-encoder on 16-pixel "images": reparameterisation with ``torch.randn_like``.

Loss: summed binary cross-entropy of the reconstruction plus the KL divergence
of the posterior from N(0, 1). Float32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._data import batches

PIXELS, HIDDEN, LATENT = 16, 12, 3


class VAE(nn.Module):
    def __init__(self, noise_scale: float = 1.0):
        super().__init__()
        # noise_scale 0 keeps the randn_like call but makes the loss independent of its draw
        # (for servers whose generator cannot match the CPU's bit for bit).
        self.noise_scale = noise_scale
        self.fc1 = nn.Linear(PIXELS, HIDDEN)
        self.fc21 = nn.Linear(HIDDEN, LATENT)
        self.fc22 = nn.Linear(HIDDEN, LATENT)
        self.fc3 = nn.Linear(LATENT, HIDDEN)
        self.fc4 = nn.Linear(HIDDEN, PIXELS)

    def encode(self, x: torch.Tensor):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std * self.noise_scale

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x: torch.Tensor):
        mu, logvar = self.encode(x.view(-1, PIXELS))
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def loss_function(recon_x, x, mu, logvar) -> torch.Tensor:
    bce = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def train(model: VAE, device, steps: int, images: torch.Tensor, *, batch_size: int = 8, lr: float = 1e-2):
    model.to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for (data,) in batches(images, batch_size=batch_size, steps=steps):
        data = data.to(device)
        optimizer.zero_grad()
        recon, mu, logvar = model(data)
        loss = loss_function(recon, data, mu, logvar)
        loss.backward()
        optimizer.step()
        losses.append(loss.item() / len(data))
    return losses, model
