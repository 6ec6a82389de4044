"""Libraries nobody here wrote, as their users run them, on ``"cpu"`` and on ``sess.device``: the device
the only difference, losses and parameters equal (issue 30's list). Each needs its package
(``pip install '.[libraries]'``: torchdiffeq, gpytorch, botorch, pyro-ppl, lightning, opacus,
transformers, peft): a test whose package is missing is skipped (``make test``'s environment installs the
``test`` extra only: scipy and scikit-learn, which gpytorch and torchdiffeq bring, are big to fetch in
every CI run). The forms that still refuse are tested to refuse loudly, naming why.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn


def _same(cpu: tuple, remote: tuple) -> None:
    (losses, params), (got_losses, got_params) = cpu, remote
    assert got_losses == losses
    assert len(got_params) == len(params)
    for want, got in zip(params, got_params):
        assert torch.equal(got.detach().cpu(), want.detach())


# -- torchdiffeq -------------------------------------------------------------------------------------


def _ode_fit(device, adjoint: bool = False, **solver) -> tuple:
    torchdiffeq = pytest.importorskip("torchdiffeq")
    torch.manual_seed(0)

    class Field(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))

        def forward(self, t, y):
            return self.net(y)

    field = Field().double().to(device)
    y0 = torch.tensor([[1.0, 0.0]], dtype=torch.float64).to(device)
    t = torch.linspace(0, solver.pop("until", 1.0), 5, dtype=torch.float64).to(device)
    optimizer = torch.optim.SGD(field.parameters(), lr=0.1)
    solve = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint
    solver = solver or {"method": "rk4", "options": {"step_size": 0.25}}
    losses = []
    for _ in range(solver.pop("steps", 3)):
        optimizer.zero_grad()
        loss = solve(field, y0, t, **solver).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, list(field.parameters())


def test_torchdiffeq_odeint(sess):
    _same(_ode_fit("cpu"), _ode_fit(sess.device))


@pytest.mark.parametrize("solver", [{}, {"until": 0.2, "steps": 2, "rtol": 1e-4, "atol": 1e-6}],
                         ids=["rk4", "dopri5"])
def test_torchdiffeq_odeint_adjoint(sess, solver):
    # its backward builds the solver's grid from the times' values and (dopri5) steps on error ratios of the
    # adjoint state: it runs on the client, staged between the server's backwards, and trains bit for bit
    _same(_ode_fit("cpu", adjoint=True, **solver), _ode_fit(sess.device, adjoint=True, **solver))


# -- gpytorch, botorch --------------------------------------------------------------------------------


def _exact_gp_fit(device) -> tuple:
    gpytorch = pytest.importorskip("gpytorch")
    torch.manual_seed(0)
    x = torch.linspace(0, 1, 20, dtype=torch.float64)
    y = torch.sin(x * 2 * math.pi) + 0.1 * torch.randn(20, dtype=torch.float64)
    x, y = x.to(device), y.to(device)

    class GP(gpytorch.models.ExactGP):
        def __init__(self, likelihood) -> None:
            super().__init__(x, y, likelihood)
            self.mean = gpytorch.means.ConstantMean()
            self.covariance = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(self.mean(inputs), self.covariance(inputs))

    likelihood = gpytorch.likelihoods.GaussianLikelihood().double().to(device)
    model = GP(likelihood).double().to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, list(model.parameters())


def test_gpytorch_exact_gp_fit(sess):
    _same(_exact_gp_fit("cpu"), _exact_gp_fit(sess.device))


def _single_task_gp_fit(device) -> tuple:
    pytest.importorskip("botorch")
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    torch.manual_seed(0)
    x = torch.rand(10, 2, dtype=torch.float64)
    model = SingleTaskGP(x.to(device), x.sum(-1, keepdim=True).sin().to(device))  # self.to(train_X) inside
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), optimizer_kwargs={"options": {"maxiter": 5}})
    return [], list(model.parameters())


def test_botorch_single_task_gp_fit(sess):
    _same(_single_task_gp_fit("cpu"), _single_task_gp_fit(sess.device))


# -- Lightning Fabric ---------------------------------------------------------------------------------


def _fabric_loop(device) -> tuple:
    lightning = pytest.importorskip("lightning")
    torch.manual_seed(0)
    fabric = lightning.Fabric(accelerator="cpu", devices=1)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double().to(device)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), move_to_device=False)
    x, y = torch.randn(8, 4, dtype=torch.float64).to(device), torch.randn(8, 1, dtype=torch.float64).to(device)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses, list(model.parameters())


def test_lightning_fabric_loop(sess):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Fabric's notes about the CPU accelerator
        _same(_fabric_loop("cpu"), _fabric_loop(sess.device))


# -- Hugging Face gradient checkpointing ----------------------------------------------------------


def _gpt2_checkpointed(device, reentrant: bool) -> tuple:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).double()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return _train_lm(model, optimizer, device, steps=2), list(model.parameters())


def _train_lm(model: nn.Module, optimizer, device, steps: int) -> list[float]:
    """A causal language model's training steps on one batch (its labels its inputs): the losses."""
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1)).to(device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("reentrant", [True, False], ids=["use_reentrant", "non-reentrant"])
def test_hugging_face_gradient_checkpointing(sess, reentrant):
    _same(_gpt2_checkpointed("cpu", reentrant), _gpt2_checkpointed(sess.device, reentrant))


def _gpt2_held_after_forward(sess, reentrant: bool | None) -> tuple[int, nn.Module]:
    """The bytes a GPT-2 forward leaves the session holding (``reentrant`` None: no checkpointing), and the model
    (kept by the caller: freed during a later forward, its parameters would count against that one)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50, n_positions=64)
    model = transformers.GPT2LMHeadModel(config)
    if reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    model = model.to(sess.device)
    ids = torch.randint(0, 50, (4, 64), generator=torch.Generator().manual_seed(1)).to(sess.device)
    before = sess.stats()["bytes"]
    loss = model(input_ids=ids, labels=ids).loss
    held = sess.stats()["bytes"] - before
    loss.backward()
    return held, model


def test_hugging_face_gradient_checkpointing_holds_less_after_the_forward(sess):
    """Both forms drop what the layers' ops save (recomputed on the server at the backward): a tenth of it kept."""
    plain, *models = _gpt2_held_after_forward(sess, None)
    for reentrant in (True, False):
        held, model = _gpt2_held_after_forward(sess, reentrant)
        models.append(model)
        assert 0 < held < plain / 10


# -- peft --------------------------------------------------------------------------------------------


def _lora_merged(device) -> tuple:
    """LoRA on a GPT-2 whose head is tied to its embedding (found by comparing ``data_ptr()``s, which once
    raised on the device), trained, then merged into the base weights."""
    transformers, peft = pytest.importorskip("transformers"), pytest.importorskip("peft")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    base = transformers.GPT2LMHeadModel(config).double()
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "lm_head"], lora_dropout=0.0,
                           init_lora_weights="gaussian", fan_in_fan_out=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's notes on the tied head and on fan_in_fan_out for lm_head
        model = peft.get_peft_model(base, lora).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    losses = _train_lm(model, optimizer, device, steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = model.merge_and_unload()
    merged.eval()
    losses.append(merged(torch.arange(8).to(device)[None]).logits.sum().item())
    return losses, list(merged.state_dict().values())


def test_peft_lora_merge_with_tied_embeddings(sess):
    _same(_lora_merged("cpu"), _lora_merged(sess.device))


# -- the refusals that remain -------------------------------------------------------------------------


def _svi(device) -> tuple:
    pyro = pytest.importorskip("pyro")
    import pyro.distributions as dist
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoDelta
    from pyro.infer.autoguide.initialization import init_to_mean

    pyro.clear_param_store()
    data = (torch.randn(30, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 1.5).to(device)

    def model(d):
        loc = pyro.sample("loc", dist.Normal(torch.zeros((), dtype=torch.float64, device=device), 5.0))
        with pyro.plate("data", len(d)):
            pyro.sample("obs", dist.Normal(loc, 1.0), obs=d)

    # init_to_mean: AutoDelta's default draws its start from the prior, on the device's generator
    svi = SVI(model, AutoDelta(model, init_loc_fn=init_to_mean), pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = [svi.step(data) for _ in range(5)]  # its warn_if_nan hooks read the gradients' values
    return losses, list(pyro.get_param_store().values())


def test_pyro_svi_with_autodelta(sess):
    _same(_svi("cpu"), _svi(sess.device))


def _private_training(device) -> tuple:
    """Opacus' PrivacyEngine in its hooks mode: forward hooks keep the activations, full backward hooks compute
    each parameter's grad_sample, the DPOptimizer clips per sample (noise_multiplier=0: the noise is drawn on
    the parameters' device, whose generator is not the CPU's, as on a GPU)."""
    opacus = pytest.importorskip("opacus")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g),
                                                                      torch.randint(0, 2, (16,), generator=g)),
                                       batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (its secure-RNG advice; torch's: no input needs a grad)
        model, optimizer, data = opacus.PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=data,
            noise_multiplier=0.0, max_grad_norm=0.5, poisson_sampling=False, grad_sample_mode="hooks")
        losses = []
        for _ in range(2):
            for x, y in data:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    return losses, list(model.parameters())


def test_opacus_hooks_mode(sess):
    _same(_private_training("cpu"), _private_training(sess.device))