"""The client's one builder of a step (``client/session/_steps.py``): a step is made from its ``proto/messages``
type, never spelled as a dict literal."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from remote_autograd import client
from remote_autograd.client.session._steps import _SHAPES, OMIT, make_step
from remote_autograd.proto.messages import BackwardStep, CallStep, FetchStep

STEP_KINDS = {kind for kind, _ in _SHAPES.values()}


def test_a_step_is_its_types_kind_then_the_fields_given_in_their_order():
    step = make_step(CallStep, op="add", args=[{"ref": "t1"}, 2], out=["t2"])
    assert list(step.items()) == [("kind", "call"), ("op", "add"), ("args", [{"ref": "t1"}, 2]), ("out", ["t2"])]
    CallStep.model_validate(step)  # what the server reads
    assert make_step(FetchStep, id="t2", value=True, grad=False) == {"kind": "fetch", "id": "t2", "value": True,
                                                                     "grad": False}


def test_omit_leaves_a_field_out_in_place():
    step = make_step(BackwardStep, tensors=["t1"], grad_tensors=OMIT, retain_graph=True, create_graph=OMIT)
    assert step == {"kind": "backward", "tensors": ["t1"], "retain_graph": True}


def test_a_field_the_type_lacks_is_refused_where_the_step_is_built():
    with pytest.raises(TypeError, match="CallStep has no field 'outs'"):
        make_step(CallStep, op="add", args=[], outs=["t2"])
    with pytest.raises(TypeError, match="FetchStep has no field 'kind'"):  # the kind is the type's, never given
        make_step(FetchStep, kind="put", id="t1")


def test_the_builder_knows_every_step_type_of_the_protocol():
    assert {"put", "call", "backward", "grad", "set_grad", "set_requires_grad", "retain_grad", "free", "fetch",
            "load", "functorch", "template", "run_template", "function", "checkpoint", "checkpoint_end"} <= STEP_KINDS


def _spelled_steps(source: str) -> list[int]:
    """Lines of dict literals with a ``"kind"`` key whose value is a step kind."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict)
            for key, value in zip(node.keys, node.values)
            if isinstance(key, ast.Constant) and key.value == "kind"
            and isinstance(value, ast.Constant) and value.value in STEP_KINDS]


def test_no_client_module_spells_a_step_as_a_dict_literal():
    package = Path(client.__file__).parent
    spelled = {str(p.relative_to(package)): lines for p in sorted(package.rglob("*.py"))
               if p.name != "_steps.py" and (lines := _spelled_steps(p.read_text()))}
    assert not spelled, f"steps built as dict literals (use session/_steps.make_step): {spelled}"
    # the check finds one (it found eleven before the builder)
    assert _spelled_steps('step = {"kind": "call", "op": "detach", "args": [], "out": ["t1"]}') == [1]
