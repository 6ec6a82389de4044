"""``template_graph``: a template's steps as one FX graph. Run as it is (eagerly, no compiler) by the
compiled way (``compiled_templates``), a template gives what the runner gives for the same steps,
bit for bit: outputs, values written in place, grads given, added to or cleared. What a graph
cannot hold exactly is refused (``Unfit``: the template then runs the plain way)."""

from __future__ import annotations

import pytest
import torch

from remote_autograd.service.engine import template_graph

from .template_cases import Case, by_compiled_way, by_runner, call, graph_of, mlp_backward, mlp_grad_then_sgd, ref
from .template_cases import attention_block


def _assert_same_bits(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, ((v1, g1), (v2, g2)) in ((n, (got[n], want[n])) for n in want):
        assert v1.dtype == v2.dtype and torch.equal(v1, v2), name
        assert (g1 is None) == (g2 is None), name
        assert g1 is None or torch.equal(g1, g2), name


@pytest.mark.parametrize("case", [mlp_backward(), mlp_backward(grads=("w1", "w2")), mlp_grad_then_sgd(),
                                  attention_block()],
                         ids=lambda c: c.name + ("+grads" if any(g is not None for _, _, g in c.inputs.values()) else ""))
def test_the_graph_run_as_it_is_gives_the_runners_answers_bit_for_bit(case):
    _assert_same_bits(by_compiled_way(case), by_runner(case))


def test_the_graph_has_what_a_run_does_after_it():
    graph = graph_of(mlp_backward(grads=("w1", "w2")))
    # w1 and w2 held grads: added to in place (read as arguments); b1 and b2 had none: given
    assert graph.effects.grads_read == (0, 2)
    assert [(k, fresh) for k, _, fresh in graph.effects.given] == [(1, True), (3, True)]
    assert graph.mutates and graph.outputs == 1
    sgd = graph_of(mlp_grad_then_sgd())
    assert [(k, fresh) for k, _, fresh in sgd.effects.given] == [(0, False), (1, False), (2, False), (3, False)]
    assert sgd.effects.grads_read == () and sgd.mutates


def test_its_numbers_are_baked_in_by_value():
    """A number is part of the variant: the graph of another lr is another graph."""
    a, b = graph_of(mlp_grad_then_sgd(lr=0.1)), graph_of(mlp_grad_then_sgd(lr=0.2))
    assert "-0.1" in a.module.code and "-0.2" in b.module.code


def _unfit(case: Case, match: str) -> None:
    with pytest.raises(template_graph.Unfit, match=match):
        graph_of(case)


def test_what_a_graph_cannot_hold_is_refused():
    base = mlp_backward()
    inputs = base.inputs
    _unfit(Case("dropout", [call("nn.functional.dropout", ref("x"), 0.5, out=["d"])], inputs, ["d"]),
           "dropout: not a call a capture replays")
    _unfit(Case("masked", [call("Tensor.nonzero", ref("y"), out=["nz"])], inputs, ["nz"]), "not a call a capture")
    _unfit(Case("requires", [{"kind": "set_requires_grad", "id": "x", "requires_grad": True}], inputs, []),
           "set_requires_grad")
    _unfit(Case("grad-of-made", [call("mul", ref("x"), 2.0, out=["m"]),
                                 {"kind": "set_grad", "id": "m", "grad": ref("x")}], inputs, []),
           "not an input")
    _unfit(Case("higher", [*base.steps[:4], {"kind": "grad", "outputs": ["loss"], "inputs": ["w1"], "out": ["g"],
                                             "create_graph": True}], inputs, []), "create_graph")
    _unfit(Case("no-grad", [call("mul", {"grad_of": "x"}, 2.0, out=["m"])], inputs, ["m"]), "has no grad")


def test_a_non_leaf_input_that_requires_grad_is_refused():
    w = torch.randn(3, requires_grad=True) * 2  # not a leaf: a graph the template would reach beyond itself
    layouts = [template_graph.Layout.of(w, None)]
    case = Case("nonleaf", [call("mul", ref("w"), 2.0, out=["m"])], {"w": (w.detach(), True, None)}, ["m"])
    with pytest.raises(template_graph.Unfit, match="not a leaf"):
        template_graph.build(case.template(), layouts, {}, torch.device("cpu"))


def test_a_grad_bound_beside_its_tensor_is_said_and_never_read_twice():
    """An optimizer binds ``p`` and ``{grad_of: p}``: one tensor is p's grad and input 1's value. The
    variant says so; a graph that also reads p's grad would take one tensor as two arguments."""
    from remote_autograd.service.engine.compiled_templates import _layouts
    from remote_autograd.service.sessions.store import CustomTensor

    p = CustomTensor(torch.randn(3, requires_grad=True), torch.randn(3))
    layouts = _layouts([p, CustomTensor(p.grad)])
    assert layouts[0].grad_bound == 1 and layouts[1].grad_bound is None
    assert _layouts([p, p]) is None  # one tensor bound twice: the plain way
    sgd = Case("sgd", [call("Tensor.sub_", ref("p"), {"grad_of": "p"}, grad_enabled=False)],
               {"p": (p.value.detach(), True, p.grad), "g": (p.grad, False, None)}, [])
    with pytest.raises(template_graph.Unfit, match="bound as input 1"):
        template_graph.build(sgd.template(), layouts, {}, torch.device("cpu"))
    reads_g = Case("sgd", [call("Tensor.sub_", ref("p"), ref("g"), grad_enabled=False)], sgd.inputs, [])
    assert template_graph.build(reads_g.template(), layouts, {}, torch.device("cpu")).effects.grads_read == ()


def test_the_sdks_training_step_as_a_template_runs_as_a_graph_with_the_runners_answers():
    """The MLP step the SDK sends (forward, backward, SGD with momentum in torch's foreach path), made
    a template as the bench does (``bench/server_compile.program_case``): one graph, the same bits."""
    from bench import server_compile

    case = server_compile.program_case("mlp", server_compile.mlp_loop(steps=3))
    assert any(step["kind"] == "backward" for step in case.steps) and case.outputs
    _assert_same_bits(by_compiled_way(case), by_runner(case))
