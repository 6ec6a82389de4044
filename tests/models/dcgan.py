"""A DCGAN pair on 8x8 images: BatchNorm, in-place ReLU/LeakyReLU, BCE, two Adams.

The discriminator's step sees ``fake.detach()`` so it does not push gradients
into the generator; the generator's step reuses the same ``fake``. Float64:
the two players amplify each other's rounding within a few steps.
"""

from __future__ import annotations

import torch
from torch import nn

from ._data import batches

NZ, NGF, NDF, NC = 8, 8, 8, 1


def weights_init(m: nn.Module) -> None:
    name = type(m).__name__
    if "Conv" in name:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif "BatchNorm" in name:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class _Player(nn.Module):
    """``main`` run on one device, or split across GPUs as the classic example does."""

    def __init__(self, main: nn.Sequential, ngpu: int = 1):
        super().__init__()
        self.ngpu = ngpu
        self.main = main

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.is_cuda and self.ngpu > 1:  # a device-type check real code makes; must answer locally
            return nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        return self.main(input)


def generator() -> _Player:
    return _Player(nn.Sequential(
        nn.ConvTranspose2d(NZ, NGF * 2, 4, 1, 0, bias=False),  # 1x1 -> 4x4
        nn.BatchNorm2d(NGF * 2),
        nn.ReLU(True),
        nn.ConvTranspose2d(NGF * 2, NC, 4, 2, 1, bias=False),  # 4x4 -> 8x8
        nn.Tanh(),
    ))


def discriminator() -> _Player:
    return _Player(nn.Sequential(
        nn.Conv2d(NC, NDF, 4, 2, 1, bias=False),  # 8x8 -> 4x4
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False),  # 4x4 -> 2x2
        nn.BatchNorm2d(NDF * 2),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(NDF * 2, 1, 2, 1, 0, bias=False),  # 2x2 -> 1x1
        nn.Sigmoid(),
        nn.Flatten(0),  # (b, 1, 1, 1) -> (b,)
    ))


class DCGAN(nn.Module):
    """The two players in one module, so one ``.to(device)`` and one ``state_dict`` cover both."""

    def __init__(self):
        super().__init__()
        self.generator = generator()
        self.discriminator = discriminator()
        self.apply(weights_init)


def train(model: DCGAN, device, steps: int, real_images: torch.Tensor, *, batch_size: int = 6,
          noise_on_device: bool = True, noise_seed: int = 7):
    """``noise_on_device``: draw the latent batches with ``torch.randn(..., device=device)`` (the
    device's generator); otherwise draw them on the CPU and move them, for servers whose
    generator cannot match the CPU's bit for bit."""
    model.to(device)
    netG, netD = model.generator, model.discriminator
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    cpu_noise = torch.Generator().manual_seed(noise_seed)
    real_label, fake_label = 1.0, 0.0
    losses = []
    for (real,) in batches(real_images, batch_size=batch_size, steps=steps):
        real = real.to(device)
        b = real.size(0)
        # (1) the discriminator: maximise log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        label = torch.full((b,), real_label, dtype=real.dtype, device=device)
        errD_real = criterion(netD(real), label)
        errD_real.backward()
        if noise_on_device:
            noise = torch.randn(b, NZ, 1, 1, dtype=real.dtype, device=device)
        else:
            noise = torch.randn(b, NZ, 1, 1, dtype=real.dtype, generator=cpu_noise).to(device)
        fake = netG(noise)
        label.fill_(fake_label)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        optD.step()
        # (2) the generator: maximise log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        errG = criterion(netD(fake), label)
        errG.backward()
        optG.step()
        losses.extend([(errD_real + errD_fake).item(), errG.item()])
    return losses, model
