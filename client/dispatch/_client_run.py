"""A user's ``torch.autograd.Function`` whose backward reads values on the client (``.item()``, a bool of a
tensor, Python control flow on them): its backward runs on the client, staged, at each backward that reaches
it (``handlers/_staged``), where ``attach`` (``_user_functions``) would have refused it.

torch's engine calls a Python Function's backward from the middle of its walk; such a backward cannot be a
template, since what it computes depends on values known only then (torchdiffeq's ``odeint_adjoint`` steps
its adjoint solve on error ratios of the incoming gradient). So the call becomes a *client-run node*:
``make`` sends a ``function`` step with ``client_backward`` (``service/engine/user_functions.py``): on the
server the outputs take a node that cuts the graph (they require grad; no backward walks through them),
named ``node`` for the backward steps that capture the gradient reaching them. Here the outputs' handles
carry this ``ClientRun`` among their ``_leaves`` (as a module hook's node id rides there), so a backward
knows from its roots alone which client-run nodes it reaches, and the record lives exactly as long as some
handle that depends on it (it holds no output handle: a saved output is a detached one, as torch saves an
output without its history). ``run`` calls the Function's own ``backward(ctx, *grads)`` as ordinary eager
remote code (each value read a round trip) and checks what it returns as torch's engine does.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch
from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame

from .._core import RemoteTensor
from ..session import _steps
from ..session._steps import Origin
from ._function_step import function_step

_ORDER = itertools.count()  # creation order, a topological order of the client-run nodes
MADE: weakref.WeakSet = weakref.WeakSet()  # the sessions that made one (a backward in the others looks for none)

# torch's own words for a backward through a graph whose saved tensors a backward freed
FREED = ("Trying to backward through the graph a second time (or directly access saved tensors after they have "
         "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
         "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or "
         "if you need to access saved tensors after calling backward.")


class ClientRun:
    """One call of a Function whose backward runs on the client: what its backward needs (``ctx``, the
    inputs), what the server calls its node (``node``), and its outputs' layouts (``outputs``: per output of
    the forward, ``(shape, dtype, differentiable)``, or None for one that is no tensor). ``freed``: a backward
    that did not retain the graph ran it (torch frees its saved tensors then)."""

    __slots__ = ("order", "name", "node", "backward", "ctx", "args", "outputs", "materialize", "session", "line",
                 "freed", "__weakref__")

    def __init__(self, name: str, node: str, backward: Any, ctx: Any, args: tuple, outputs: list,
                 materialize: bool, session: Any, line: str | None) -> None:
        self.order, self.name, self.node, self.backward, self.ctx = next(_ORDER), name, node, backward, ctx
        self.args, self.outputs, self.materialize, self.session, self.line = args, outputs, materialize, session, line
        self.freed = False

    def __repr__(self) -> str:
        return f"<{self.name} run on the client ({self.node})>"

    def run(self, grads: list) -> list:
        """The Function's backward on ``grads`` (one per tensor output, a handle or None), as torch's engine
        calls it with ``create_graph`` off: the gradient of each of ``args`` to pass on (None: none)."""
        tensor_grads = iter(grads)
        given = []
        for meta in self.outputs:
            g = None if meta is None else next(tensor_grads)
            if g is None and meta is not None and self.materialize:  # torch's zeros where no gradient flows
                g = torch.zeros(meta[0], dtype=meta[1], device=self.session.device)
            given.append(g)
        compiling = _set_eval_frame(None)  # inside torch.compile's call, dynamo would compile the user's code here
        try:
            with torch.no_grad():  # torch runs a backward with grad mode as create_graph (refused before: off)
                returned = self.backward(self.ctx, *given)
        finally:
            _set_eval_frame(compiling)
        return self._checked(returned if isinstance(returned, tuple) else (returned,))

    def _checked(self, returned: tuple) -> list:
        """What the backward returned, checked and fitted as torch's engine does (``validate_outputs``):
        a count, a grad for a non-tensor, a shape only summed to its input's, a dtype cast to it."""
        name, at = self.name, f" ({self.line})" if self.line else ""
        if len(returned) < len(self.args) or any(r is not None for r in returned[len(self.args):]):
            raise RuntimeError(f"function {name}Backward returned an incorrect number of gradients (expected "
                               f"{len(self.args)}, got {len(returned)}){at}")
        found = []
        for i, (a, r) in enumerate(zip(self.args, returned)):
            if not isinstance(a, torch.Tensor):
                if r is not None:
                    raise RuntimeError(f"function {name}Backward returned a gradient different than None at "
                                       f"position {i + 1}, but the corresponding forward input was not a Variable{at}")
                found.append(None)
                continue
            if r is None or not isinstance(a, RemoteTensor) or not a._rg:  # torch drops what needs no gradient
                found.append(None)
                continue
            if not (isinstance(r, RemoteTensor) and r._session is a._session):
                raise RuntimeError(f"{name}.backward returned a {type(r).__name__} as the gradient of remote input "
                                   f"{i} (a remote tensor of its session goes there){at}")
            if r._shape != a._shape:
                if not _expandable(a._shape, r._shape):
                    raise RuntimeError(f"Function {name}Backward returned an invalid gradient at index {i} - got "
                                       f"{list(r._shape)} but expected shape compatible with {list(a._shape)}{at}")
                r = r.sum_to_size(a._shape)
            if r._dtype != a._dtype:
                r = r.to(a._dtype)
            found.append(r)
        return found


def _expandable(shape: tuple, to: tuple) -> bool:
    """torch's ``is_expandable_to(shape, to)``."""
    if len(shape) > len(to):
        return False
    return all(s == t or s == 1 for s, t in zip(reversed(shape), reversed(to)))


def make(cls: type, backward: Any, ctx: Any, args: tuple, outputs: tuple, tensors: list, nodes: list, session: Any,
         line: str | None) -> None:
    """Make the call of ``cls.apply(*args)`` a client-run node (see the module's docstring): its ``function``
    step queued, its outputs' handles non-leaves that require grad and depend on it alone. ``ctx``: what the
    backward is given (``_user_functions._Ctx``: the saved tensors as handles, a saved output detached)."""
    name = getattr(cls, "__name__", "a torch.autograd.Function")
    node = session.new_id()
    differentiable = iter(n is not None for n in nodes)
    layouts = [None if not isinstance(o, torch.Tensor) else (o._shape, o._dtype, next(differentiable))
               for o in outputs]
    record = ClientRun(name, node, backward, ctx, args, layouts,
                       getattr(ctx, "_remote_autograd_materialize_grads", True) is not False, session, line)
    step = function_step(name, [], tensors, nodes, [], node=node, client_backward=True)
    session.enqueue(step, Origin("function", _steps.where(), [weakref.ref(o) for o in tensors]))
    MADE.add(session)
    leaves = frozenset({record})
    for o, n in zip(tensors, nodes):
        if n is not None:
            o._rg, o._is_leaf, o._leaves = True, False, leaves
