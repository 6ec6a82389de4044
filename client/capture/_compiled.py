"""``CompiledGraph``: what dynamo calls each time a compiled graph runs (the hot path of a compiled step).

One call queues one ``run_template`` step: the template's id, the input handles' ids, this call's
numbers and new ids for the outputs, which are handles made at once with their metadata from the
plan (``_translate``): nothing waits for the server. The template itself goes to a session the first
time a call meets it there (``SessionCore.ensure_template``); after a server restart the session sends
it again by itself. The graph's local part (sizes, numbers, CPU tensors) runs here first, and the
bookkeeping the recording worked out is applied to this call's handles: leaves, views, versions.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.fx.node import map_aggregate

from remote_autograd.proto.messages import RunTemplateStep

from .._core import RemoteTensor
from ..device._device import session_for
from ..device._device_rule import mixed_devices
from ..session._steps import Origin, make_step, where
from ..tensor import _views
from ._symbols import evaluate
from ._translate import Plan


class CompiledGraph:
    """A graph made a template: calling it queues one step and returns the graph's outputs."""

    def __init__(self, plan: Plan, gm: torch.fx.GraphModule, device: torch.device) -> None:
        self.plan, self.gm, self.device = plan, gm, device
        self.tid = plan.template["id"]
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.arg_index = {n: k for k, n in enumerate(self.placeholders)}
        # the remote inputs dynamo keeps as attributes of the graph (an optimizer's state): read once, as
        # the graph holds them for good (a changed one is a new graph: dynamo guards the objects it lifted)
        self.attrs = [getattr(gm, where) if kind == "attr" else None for kind, where in plan.remote]
        self.args = [(r, where) for r, (kind, where) in enumerate(plan.remote) if kind == "arg"]

    def __call__(self, *args: Any) -> list:
        plan = self.plan
        handles = self._handles(args)
        session = handles[0]._session if handles else session_for(self.device, "a compiled graph")
        env = self._run_locals(args) if plan.locals else {}
        bindings = plan.symbols.bind(args, env) if plan.dynamic else None
        inputs = []
        for kind, what in plan.inputs:
            if kind == "remote":
                a = handles[what]
                if a._error is not None:
                    raise a._error
                if a._session is not session:
                    raise mixed_devices(session.device, a.device)
                inputs.append({"ref": a._id} if a._grad_owner is None else {"grad_of": a._grad_owner._id})
            else:  # a CPU tensor the graph's remote calls take: uploaded, as eager code does
                t = env[what]
                inputs.append(RemoteTensor._upload(session, t.detach(), requires_grad=False, grad=None)._ref())
        scalars = [_number(env[node] if node in env else args[self.arg_index[node]], path, kind, item)
                   for node, path, kind, item in plan.scalars]
        dtype = torch.get_default_dtype()  # dynamo guards it: the one the template was recorded under
        if dtype is not session._queue_dtype:  # the program runs under it, as call_op's would
            session.globals_changed(dtype)
        if torch.is_anomaly_enabled() and plan.autograd:  # dynamo does not guard it: never baked in, never lost
            raise RuntimeError(
                f"torch.autograd.detect_anomaly() around a compiled graph that runs a backward ({where()}): the "
                "remote backend cannot check that backward's nodes; call the function without torch.compile "
                "while detecting anomalies")
        session.ensure_template(self.tid, plan.template)
        outs, ids = [], []
        for spec in plan.outputs:
            shape = spec.shape if bindings is None else tuple(evaluate(d, bindings) for d in spec.shape)
            leaves: frozenset = frozenset()
            for r in spec.leaves:
                a = handles[r]
                if a._rg and a._leaves:
                    leaves = leaves | a._leaves
            tid = session.new_id()
            o = RemoteTensor._new(session, tid, shape, spec.dtype, requires_grad=spec.requires_grad, leaves=leaves,
                                  is_leaf=spec.is_leaf)
            if spec.view_of is not None:
                _views.alias(o, handles[spec.view_of], differentiable=spec.differentiable_view)
            o._strides = spec.strides
            outs.append(o)
            ids.append(tid)
        session.enqueue(make_step(RunTemplateStep, template=self.tid, inputs=inputs, scalars=scalars, out=ids),
                        Origin("run_template", where(), [weakref.ref(o) for o in outs]))
        for r, times, rg, leaf_inputs in plan.bumps:
            leaves = frozenset().union(*(handles[j]._leaves for j in leaf_inputs)) if rg else frozenset()
            for _ in range(times):
                _views.after_inplace(handles[r], rg, leaves)
        return [self._result(result, args, handles, outs, env) for result in plan.results]

    def _handles(self, args: tuple) -> list:
        """The call's remote inputs in the plan's order: the graph's attributes, and its arguments in between."""
        handles = self.attrs.copy()
        for r, where in self.args:
            handles[r] = args[where]
        return handles

    def _result(self, result: tuple, args: tuple, handles: list, outs: list, env: dict) -> Any:
        kind, what = result
        if kind == "out":
            return outs[what]
        if kind == "input":
            return handles[what]
        if kind == "local":
            return env[what] if what in env else args[self.arg_index[what]]
        return what

    def _run_locals(self, args: tuple) -> dict:
        """The graph's local nodes on this call's arguments (sizes, numbers, CPU tensors), in order."""
        plan = self.plan
        env: dict = dict(zip(self.placeholders, args))
        grad_mode = torch.is_grad_enabled()
        try:
            for n in plan.locals:
                if n in plan.symbolic_locals:  # reads a size of a tensor the template makes
                    bindings = plan.symbols.bind(args, env)
                    env[n] = map_aggregate(n.meta["example_value"], lambda v: evaluate(v, bindings))
                elif n.op == "get_attr":
                    env[n] = getattr(self.gm, n.target)
                else:
                    a, kw = map_aggregate((n.args, n.kwargs), lambda x: env[x] if isinstance(x, torch.fx.Node) else x)
                    env[n] = n.target(*a, **kw) if n.op == "call_function" else getattr(a[0], n.target)(*a[1:], **kw)
        finally:
            torch.set_grad_enabled(grad_mode)
        return env


def _number(value: Any, path: tuple, kind: str, item: bool) -> Any:
    for i in path:
        value = value[i]
    if item:
        value = value.item()
    return float(value) if kind == "float" else int(value)
