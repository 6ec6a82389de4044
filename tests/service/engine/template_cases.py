"""Small templates (the steps ``torch.compile(..., backend="remote")`` sends) and the two ways to run
them, for ``test_template_graph.py`` and ``test_compiled_templates.py``: the runner (the steps as a
program, the template's numbers written in) and the compiled way (``compiled_templates``'s run of a
variant whose function is the graph's own module run eagerly, or inductor's compile of it). The
``Case`` and the runs are the bench's (``bench/server_compile.py``), which times the same two ways. And
``variants_of_its_own``: the service's variants of a test's own, for the tests that count them."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from bench.server_compile import Case, _run, _written, compiled_run, eager_variant
from remote_autograd.proto import dtype_name
from remote_autograd.service.engine import compiled_templates, template_compile
from remote_autograd.service.engine.template_compile import Compiler, Variant
from remote_autograd.service.settings import Settings

CPU = torch.device("cpu")


@contextlib.contextmanager
def variants_of_its_own() -> Iterator[Compiler]:
    """The service's templates find, inside, only the variants made inside (as in a server of their own):
    a tenant's variants are the process's, and the tests before made some (the least recently used would
    make way for new ones, and take their runs out of ``Compiler.figures``)."""
    fresh, shared = Compiler(), template_compile.COMPILER
    template_compile.COMPILER = compiled_templates.COMPILER = fresh
    try:
        yield fresh
    finally:  # its compiles ended before what they were asked under is undone (a test's patches)
        fresh.wait(timeout=600)
        template_compile.COMPILER = compiled_templates.COMPILER = shared


def ref(name: str) -> dict:
    return {"ref": name}


def call(op: str, *args, out=(), grad_enabled: bool = True, **kwargs) -> dict:
    return {"kind": "call", "op": op, "args": list(args), "kwargs": kwargs, "out": list(out),
            "grad_enabled": grad_enabled}


def state(session, names: list[str]) -> dict[str, tuple]:
    """Each named tensor's value and grad, copied."""
    out = {}
    for name in names:
        ct = session.tensors[name]
        out[name] = (ct.value.detach().clone(), None if ct.grad is None else ct.grad.detach().clone())
    return out


def by_runner(case: Case) -> dict[str, tuple]:
    """The template's steps run by the runner as one program: inputs and outputs afterwards."""
    settings = Settings.from_env({})
    session = case.session(settings)
    _run(session, {"id": "run", "steps": _written(case.steps, case.scalars), "omit_known_meta": True}, settings)
    return state(session, [*case.inputs, *case.outputs])


def by_compiled_way(case: Case, variant: Variant | None = None) -> dict[str, tuple]:
    """The template run once by ``compiled_templates`` with ``variant`` (by default the graph's own
    module, run eagerly): inputs and outputs (under the template's names) afterwards."""
    settings = Settings.from_env({})
    session = case.session(settings)
    variant = variant or eager_variant(case, CPU)
    once: Callable = compiled_run(case, variant, session, settings, keep=True)
    once()
    for name, tid in zip(case.outputs, (f"out.{i}" for i in range(len(case.outputs)))):
        session.tensors[name] = session.tensors.pop(tid)
    return state(session, [*case.inputs, *case.outputs])


def graph_of(case: Case):
    return eager_variant(case, CPU).graph


# -- the cases ----------------------------------------------------------------------------------


def _mlp_inputs(seed: int, grads: tuple[str, ...] = ()) -> dict:
    """The MLP's parameters (those named in ``grads`` holding a grad), a batch and its labels."""
    g = torch.Generator().manual_seed(seed)
    params = {"w1": torch.randn(32, 20, generator=g) * 0.2, "b1": torch.randn(32, generator=g) * 0.1,
              "w2": torch.randn(5, 32, generator=g) * 0.2, "b2": torch.randn(5, generator=g) * 0.1}
    x, y = torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)
    inputs = {name: (p, True, torch.randn(p.shape, generator=g) if name in grads else None)
              for name, p in params.items()}
    return {**inputs, "x": (x, False, None), "y": (y, False, None)}


_FORWARD = [call("nn.functional.linear", ref("x"), ref("w1"), ref("b1"), out=["h"]),
            call("relu", ref("h"), out=["a"]),
            call("nn.functional.linear", ref("a"), ref("w2"), ref("b2"), out=["o"]),
            call("nn.functional.cross_entropy", ref("o"), ref("y"), out=["loss"])]


def mlp_backward(seed: int = 0, grads: tuple[str, ...] = ()) -> Case:
    """Forward and ``loss.backward()`` (grads added into those the leaves hold, given to the others)."""
    return Case("mlp-backward", [*_FORWARD, {"kind": "backward", "tensors": ["loss"]},
                                 call("Tensor.detach", ref("loss"), out=["out"])],
                _mlp_inputs(seed, grads), ["out"])


def mlp_grad_then_sgd(seed: int = 0, lr: float = 0.1) -> Case:
    """As dynamo traces a step: ``autograd.grad``, each grad set on its leaf, then SGD with momentum
    as torch's foreach path runs it, in place on the parameters and the buffers, its lr a number."""
    params = ["w1", "b1", "w2", "b2"]
    inputs = _mlp_inputs(seed)
    g = torch.Generator().manual_seed(seed + 1)
    for p in params:
        inputs[f"m_{p}"] = (torch.randn(inputs[p][0].shape, generator=g), False, None)
    grads = [f"g_{p}" for p in params]
    steps = [*_FORWARD,
             {"kind": "grad", "outputs": ["loss"], "inputs": params, "out": grads},
             *({"kind": "set_grad", "id": p, "grad": ref(gp)} for p, gp in zip(params, grads)),
             call("_foreach_mul_", [ref(f"m_{p}") for p in params], 0.9, grad_enabled=False),
             call("_foreach_add_", [ref(f"m_{p}") for p in params], [{"grad_of": p} for p in params],
                  grad_enabled=False),
             call("_foreach_add_", [ref(p) for p in params], [ref(f"m_{p}") for p in params],
                  alpha={"scalar": "neg_lr"}, grad_enabled=False),
             call("Tensor.detach", ref("loss"), out=["out"])]
    return Case("mlp-sgd", steps, inputs, ["out"], {"neg_lr": -lr})


def attention_block(seed: int = 0) -> Case:
    """A GPT's block in small: embeddings by index, positions by ``arange``, layer norm, causal
    attention, a residual, a basic index, then the loss (logits by the tied embedding) and its backward."""
    g = torch.Generator().manual_seed(seed)
    vocab, t, d = 11, 6, 8
    inputs = {"wte": (torch.randn(vocab, d, generator=g) * 0.3, True, None),
              "wpe": (torch.randn(t, d, generator=g) * 0.3, True, None),
              "ln_w": (torch.ones(d), True, None), "ln_b": (torch.zeros(d), True, None),
              "qkv": (torch.randn(3 * d, d, generator=g) * 0.3, True, None),
              "idx": (torch.randint(0, vocab, (2, t), generator=g), False, None),
              "tgt": (torch.randint(0, vocab, (2, t), generator=g), False, None)}
    steps = [call("arange", t, dtype={"dtype": "int64"}, out=["pos"]),
             call("nn.functional.embedding", ref("idx"), ref("wte"), out=["tok"]),
             call("nn.functional.embedding", ref("pos"), ref("wpe"), out=["pe"]),
             call("add", ref("tok"), ref("pe"), out=["x"]),
             call("nn.functional.layer_norm", ref("x"), [d], ref("ln_w"), ref("ln_b"), out=["xn"]),
             call("nn.functional.linear", ref("xn"), ref("qkv"), out=["qkv_x"]),
             call("Tensor.split", ref("qkv_x"), d, dim=2, out=["q", "k", "v"]),
             call("nn.functional.scaled_dot_product_attention", ref("q"), ref("k"), ref("v"), is_causal=True,
                  out=["att"]),
             call("add", ref("x"), ref("att"), out=["x2"]),
             call("getitem", ref("x2"), [{"ellipsis": True}, {"slice": [None, None, None]}], out=["x3"]),
             call("nn.functional.linear", ref("x3"), ref("wte"), out=["logits"]),  # tied to the embedding
             call("Tensor.view", ref("logits"), -1, vocab, out=["flat"]),
             call("Tensor.view", ref("tgt"), -1, out=["flat_t"]),
             call("nn.functional.cross_entropy", ref("flat"), ref("flat_t"), out=["loss"]),
             {"kind": "backward", "tensors": ["loss"]},
             call("Tensor.detach", ref("loss"), out=["out"])]
    return Case("attention", steps, inputs, ["out"])


def train_step(seed: int = 0) -> Case:
    """A training step in one template: forward, ``backward`` (its grads added into those the
    parameters hold), then SGD in place on two parameters, its lr a number."""
    base = mlp_backward(seed, grads=("w1", "b1", "w2", "b2"))
    sgd = call("_foreach_add_", [ref("w1"), ref("b1")], [{"grad_of": "w1"}, {"grad_of": "b1"}],
               alpha={"scalar": "neg_lr"}, grad_enabled=False)
    return Case("train-step", [*base.steps, sgd], base.inputs, base.outputs, {"neg_lr": -0.1})


def template_step(case: Case, tid: str) -> dict:
    """The case as a ``template`` step (proto/SPEC.md §5): its inputs' declared layouts, its numbers."""
    kinds = {bool: "bool", int: "int", float: "float"}
    return {"kind": "template", "id": tid,
            "inputs": [{"id": name, "dtype": dtype_name(v.dtype), "shape": list(v.shape), "requires_grad": rg}
                       for name, (v, rg, _) in case.inputs.items()],
            "scalars": [{"id": name, "kind": kinds[type(v)]} for name, v in case.scalars.items()],
            "steps": case.steps, "outputs": case.outputs}
