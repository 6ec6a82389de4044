"""torch's module full backward hooks on remote tensors: ``register_full_backward_hook``,
``register_full_backward_pre_hook`` and the global ``register_module_full_backward_hook``/``_pre_hook``.

torch sets them up at the module's call (``torch.utils.hooks.BackwardHook``): ``BackwardHookFunction.apply``
on the module's tensor inputs and on its outputs (an identity), then ``grad_fn.register_hook`` on each
one's node with a closure of its own: the outputs' node calls the pre-hooks with the gradients it is
given, the inputs' node calls the hooks with the gradients it passes on (and those the pre-hooks left).
The SDK applies that Function as any user Function (``dispatch/_user_functions``), naming its server node;
its outputs' ``grad_fn`` is a ``HookNode``, which takes the closure here, for that node.

At each ``backward()`` and ``torch.autograd.grad`` call each such node the session still knows is named in
the step's ``node_hooks``: as the node runs the server keeps the gradients its closure reads and answers
the node among the ``observed`` (``service/engine/tensor_hooks``); once the step has answered (the call
waits for it), the closures run here on those gradients, in the order torch ran the nodes. So the
module's hooks see the tensors torch's would, in torch's order, after the backward: one that stores
them or computes from them (Opacus' per-sample gradients, a norm logged) gives torch's result; one that
returns new gradients raises at that call (they would have had to flow on inside the server's backward).
The server answers a node no graph holds any more as ``gone``, and its closures are forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

from torch.utils.hooks import RemovableHandle

from ..session._callsite import where
from ..tensor._tensor import RemoteTensor

# what each of torch's BackwardHook closures reads (torch.utils.hooks): the grads its node passes on, or those
# it is given
_READS = {"BackwardHook._set_user_hook.<locals>.hook": "inputs",
          "BackwardHook.setup_output_hook.<locals>.fn.<locals>.hook": "outputs"}


class HookNode:
    """``grad_fn`` of an output of torch's ``BackwardHookFunction`` on remote tensors (its node lives on the
    server): it takes torch's own module-hook closures; anything else is refused, as any remote node's."""

    def __init__(self, t: RemoteTensor, node: tuple) -> None:
        self._session, (self._node, self._inputs, self._outputs) = t._session, node

    def name(self) -> str:
        return "BackwardHookFunctionBackward"

    def __repr__(self) -> str:
        return "<BackwardHookFunctionBackward (on the server)>"

    def register_hook(self, fn) -> RemovableHandle:
        if getattr(fn, "__module__", None) != "torch.utils.hooks" or getattr(fn, "__qualname__", None) not in _READS:
            raise RuntimeError("grad_fn.register_hook of a remote tensor: only torch's module backward hooks "
                               f"(nn.Module.register_full_backward_hook) run on its nodes ({where()})")
        hooks = self._session._node_hooks.setdefault(self._node, (self._inputs, self._outputs, OrderedDict()))[2]
        handle = RemovableHandle(hooks)
        hooks[handle.id] = fn
        return handle

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"grad_fn.{name} of a remote tensor: the autograd graph lives on the server")


def node_hook_steps(session: Any) -> tuple[list[dict], dict]:
    """The ``node_hooks`` of a backward or grad step about to be queued, and what runs each, by its
    ``observe`` id (``_hooks.run_observed``)."""
    found, observed = [], {}
    for node, (inputs, outputs, hooks) in list(session._node_hooks.items()):
        for fn in list(hooks.values()):
            reads = _READS[fn.__qualname__]
            kept = [(session.new_id(), layout) for layout in (inputs if reads == "inputs" else outputs)]
            oid = session.new_id()
            found.append({"node": node, "grads": reads, "observe": oid, "keep": [kid for kid, _ in kept]})
            observed[oid] = partial(_run, session, fn, reads, kept)
    return found, observed


def forget(session: Any, gone: list | None) -> None:
    """The closures of the nodes the server answered ``gone`` (no graph holds them: they run no more)."""
    for node in gone or ():
        session._node_hooks.pop(node, None)


def _run(session: Any, fn, reads: str, kept: list, present: frozenset, at: str) -> None:
    """torch's closure ``fn`` on the gradients kept for it, as torch's node calls it (``None`` for one the
    node did not have)."""
    grads = tuple(RemoteTensor._new(session, kid, shape, dtype) if kid in present else None
                  for kid, (shape, dtype) in kept)
    out = fn(grads, None) if reads == "inputs" else fn(None, grads)
    if out is not None and (len(out) != len(grads) or any(o is not g for o, g in zip(out, grads))):
        kind = "hook" if reads == "inputs" else "pre-hook"
        raise RuntimeError(f"a module backward {kind} on remote tensors returned new gradients: module backward "
                           "hooks run on the client after the server's backward, on the gradients torch would "
                           "give them, so they may read and store them but not replace them; register a "
                           f"Tensor.register_hook on the module's output or input instead ({at})")
