"""``Tensor.register_hook`` on a RemoteTensor: the hook is kept on the handle and runs inside the
server's backward.

A hook reads Python values that change (a clipping bound, a scale, a step counter): recorded once
and replayed, it would go stale without a word. So each ``backward()`` and ``torch.autograd.grad``
call records the hooks of every hooked tensor of the session anew (``hook_steps``), each tensor's
hooks in order on a stand-in of its gradient (``dispatch/_user_functions``' recording: a ``Recorder``,
the real session refusing every step), into a template named by its content, and names them in the
step (``hooks``); the server registers them for that step alone (``service/engine/tensor_hooks.py``).
A hook therefore runs once on the client at each call, whether or not that backward reaches its
tensor: Python side effects happen then, and a hook that reads values (``.item()``, printing the
gradient) or a remote tensor it is not given (its gradient is all it gets) raises at that call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ..dispatch._user_functions import BackwardRecorder, record, stand_in
from ..session._callsite import where
from ..session._recorder import Recorder, Untranslatable
from ..tensor._tensor import RemoteTensor
from ._handler_table import HandlerTable

T = torch.Tensor
HANDLERS = HandlerTable()
_answers = HANDLERS.on
_HOOKS = "_remote_hooks"  # a handle's own hooks (in its __dict__: only hooked handles carry them), by handle id


@_answers(T.register_hook)
def _register_hook(t: RemoteTensor, hook) -> RemovableHandle:
    if not t._rg:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if isinstance(t._session, Recorder):  # a stand-in of a recording: nothing would ever run the hook
        raise RuntimeError(f"Tensor.register_hook inside a recorded backward or compiled graph, on a remote tensor: "
                           f"not supported ({where()})")
    hooks = t.__dict__.get(_HOOKS)
    if hooks is None:
        hooks = t.__dict__[_HOOKS] = OrderedDict()
        t._session._hooked[id(t)] = t
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def hook_steps(session: Any) -> list[dict]:
    """The ``hooks`` of a backward or grad step about to be queued: each hooked tensor's hooks recorded now
    (their templates queued first)."""
    found = []
    for t in list(session._hooked.values()):
        hooks = t.__dict__.get(_HOOKS)
        if not hooks or t._id is None:
            continue
        tid = _record_hooks(session, t, list(hooks.values()))
        if tid is not None:
            found.append({"id": t._id, "template": tid})
    return found


def _record_hooks(session: Any, t: RemoteTensor, hooks: list) -> str | None:
    name = f"a hook on a remote tensor ({', '.join(getattr(h, '__qualname__', type(h).__name__) for h in hooks)})"
    recorder = BackwardRecorder(session, name, f"{name} reads a remote tensor it is not given (a hook gets its "
                                f"gradient only): compute it from the gradient, or after backward ({where()})")
    grad = stand_in(recorder, "g0", t, False, contiguous=True)

    def run_hooks() -> RemoteTensor:
        current = grad
        for hook in hooks:
            out = hook(current)
            if out is None:
                continue
            if not (isinstance(out, RemoteTensor) and out._session is recorder):
                raise RuntimeError(f"{name} returned a {type(out).__name__} where a gradient of the device goes")
            if out._shape != t._shape:
                raise RuntimeError(f"hook '{getattr(hook, '__name__', hook)}' has changed the size of value")
            current = out
        return current

    try:
        result = record(session, recorder, name, run_hooks)
    except Untranslatable as why:
        raise RuntimeError(f"{name} cannot run inside the server's backward: {why} ({where()})") from None
    if result is grad:  # every hook returned None: nothing to run there (its side effects happened here)
        return None
    template = recorder.template([grad], [result])
    session.ensure_template(template["id"], template)
    return template["id"]
