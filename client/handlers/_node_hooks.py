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

import dis
import inspect
import weakref
from collections import OrderedDict
from functools import partial
from typing import Any

from torch.utils.hooks import RemovableHandle

from .._core import RemoteTensor
from ..dispatch._user_functions import BackwardRecorder, record
from ..session._steps import where
from ..session._recorder import Untranslatable
from ._hooks import Answer, rebind

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


def node_hook_steps(session: Any, reached: frozenset) -> tuple[list[dict], list[dict], dict]:
    """The ``node_hooks`` and ``module_hooks`` of a backward or grad step about to be queued (the templates
    of the latter queued first), and what runs each observed one, by its ``observe`` id
    (``_hooks.run_observed``). A module call's hooks are recorded only where its nodes are in ``reached`` (the
    "leaves" of the step's roots), as torch calls them only where its backward reaches them; the others are
    observed (an observed node that does not run runs nothing), and so answered ``gone`` once dead."""
    found, recorded, observed = [], [], {}
    for bh, parts in _module_calls(session).items():
        if not _only_look(bh) and any(part[0] in reached for part in parts.values()):
            try:
                entry, escaped = _record(session, bh, parts)
            except _ReadsValues:
                pass  # observed below: its hooks read values
            else:
                if entry is not None:
                    recorded.append(entry)
                for reads, standins in escaped.items():  # kept, and made the gradients they stand for
                    _observe(session, parts[reads], partial(_rebind, session, standins), found, observed)
                continue
        for part in parts.values():
            _observe(session, part, partial(_run, session, part[1]), found, observed)
    return found, recorded, observed


def _module_calls(session: Any) -> dict:
    """The session's node hooks by module call (torch's ``BackwardHook``), each as ``{reads: (node, fn,
    layouts)}``."""
    calls: dict = {}
    for node, (inputs, outputs, hooks) in list(session._node_hooks.items()):
        for fn in list(hooks.values()):
            reads = _READS[fn.__qualname__]
            calls.setdefault(_owner(fn), {})[reads] = (node, fn, inputs if reads == "inputs" else outputs)
    return calls


def _owner(fn) -> Any:
    """The ``BackwardHook`` a closure of torch's belongs to (its ``self``)."""
    return fn.__closure__[fn.__code__.co_freevars.index("self")].cell_contents


def _observe(session: Any, part: tuple, run, found: list, observed: dict) -> None:
    node, fn, layouts = part
    reads = _READS[fn.__qualname__]
    kept = [(session.new_id(), layout) for layout in layouts]
    oid = session.new_id()
    found.append({"node": node, "grads": reads, "observe": oid, "keep": [kid for kid, _ in kept]})
    observed[oid] = partial(run, reads, kept)


def _only_look(bh: Any) -> bool:
    """Whether every hook of the module call can only return None (so none can replace a gradient)."""
    return all(_returns_none(h) for h in (*bh.user_hooks, *bh.user_pre_hooks))


def _returns_none(fn) -> bool:
    """Whether ``fn``'s code returns None wherever it returns (read from its bytecode; unsure: False)."""
    while isinstance(fn, partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None), "__code__", None)
    if code is None or code.co_flags & _NOT_A_PLAIN_FUNCTION:
        return False
    instructions = list(dis.get_instructions(code))
    for k, i in enumerate(instructions):
        if i.opname == "RETURN_CONST" and i.argval is not None:
            return False
        if i.opname == "RETURN_VALUE" and not (k and instructions[k - 1].opname == "LOAD_CONST"
                                               and instructions[k - 1].argval is None):
            return False
    return True


_NOT_A_PLAIN_FUNCTION = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class _ReadsValues(Exception):
    """A module call's hooks read their gradients' values: they cannot be recorded, only observed."""


def _record(session: Any, bh: Any, parts: dict) -> tuple[dict | None, dict]:
    """The module call's closures recorded on stand-ins of the gradients each node reads: its
    ``module_hooks`` entry (None when no hook replaces a gradient), and the stand-ins the hooks kept (by what
    they stand for), to be made the gradients themselves after the step."""
    name = f"the backward hooks of a {type(bh.module).__name__}"
    recorder = BackwardRecorder(session, name, f"{name} read a remote tensor they are not given (a module's "
                                f"backward hook gets its gradients): compute it from them, or after backward ({where()})")
    standins = {reads: [_stand_in(recorder, f"{reads[0]}{k}", layout) for k, layout in enumerate(part[2])]
                for reads, part in parts.items()}
    given = standins.get("outputs", [])
    passed = standins.get("inputs", [])

    def run_closures() -> tuple:
        try:
            out = parts["outputs"][1](None, tuple(given)) if "outputs" in parts else None
            inn = parts["inputs"][1](tuple(passed), None) if "inputs" in parts else None
        finally:
            bh.grad_outputs = None  # as torch's closures leave it
        return out, inn

    try:
        out, inn = record(session, recorder, name, run_closures)
    except Untranslatable:
        raise _ReadsValues() from None
    bound = [*given, *passed]
    made: list = []
    picks = [_picks(name, recorder, out, given, bound, made), _picks(name, recorder, inn, passed, bound, made)]
    entry = None
    if any(k != j for j, k in enumerate(picks[0])) or any(k != len(given) + j for j, k in enumerate(picks[1])):
        entry = {"outputs": picks[0], "inputs": picks[1]}
        if made:  # (none: the hooks pass some gradients on unchanged and None for the others)
            template = recorder.template(bound, made)
            session.ensure_template(template["id"], template)
            entry["template"] = template["id"]
        for reads, key in (("outputs", "outputs_node"), ("inputs", "inputs_node")):
            if reads in parts:
                entry[key] = parts[reads][0]
    del out, inn, bound, made, given, passed
    escaped = {}
    for reads, handles in standins.items():
        refs = [weakref.ref(h) for h in handles]
        handles.clear()
        if any(r() is not None for r in refs):  # a hook kept its gradient (appended it, stored it on the module)
            escaped[reads] = refs
    return entry, escaped


def _stand_in(recorder: Any, name: str, layout: tuple) -> RemoteTensor:
    shape, dtype = layout
    return RemoteTensor._new(recorder, name, shape, dtype)


def _picks(name: str, recorder: Any, returned: tuple | None, grads: list, bound: list, made: list) -> list:
    """What a node passes on in place of ``grads``: indices into ``bound``, then into ``made`` (the template's
    outputs, added to here); None where no gradient flows on."""
    if returned is None:
        returned = tuple(grads)
    if len(returned) != len(grads):
        raise RuntimeError(f"{name} returned {len(returned)} gradients for {len(grads)} ({where()})")
    picks = []
    for r, g in zip(returned, grads):
        if r is None:
            picks.append(None)
            continue
        if not (isinstance(r, RemoteTensor) and r._session is recorder):
            raise RuntimeError(f"{name} returned a {type(r).__name__} where a gradient of the device goes ({where()})")
        if r._shape != g._shape:
            raise RuntimeError(f"{name} returned a gradient of shape {list(r._shape)} for one of shape "
                               f"{list(g._shape)} ({where()})")
        at = next((k for k, b in enumerate(bound) if b is r), None)
        if at is None:
            if not any(m is r for m in made):
                made.append(r)
            at = len(bound) + next(k for k, m in enumerate(made) if m is r)
        picks.append(at)
    return picks


def _rebind(session: Any, refs: list, reads: str, kept: list, answer: Answer, at: str) -> None:
    for ref, (kid, _) in zip(refs, kept):
        rebind(session, ref, kid, answer.present)


def forget(session: Any, gone: list | None) -> None:
    """The closures of the nodes the server answered ``gone`` (no graph holds them: they run no more)."""
    for node in gone or ():
        session._node_hooks.pop(node, None)


def _run(session: Any, fn, reads: str, kept: list, answer: Answer, at: str) -> None:
    """torch's closure ``fn`` on the gradients kept for it, as torch's node calls it (``None`` for one the
    node did not have)."""
    grads = tuple(RemoteTensor._new(session, kid, shape, dtype) if kid in answer.present else None
                  for kid, (shape, dtype) in kept)
    out = fn(grads, None) if reads == "inputs" else fn(None, grads)
    if out is not None and (len(out) != len(grads) or any(o is not g for o, g in zip(out, grads))):
        kind = "hook" if reads == "inputs" else "pre-hook"
        raise RuntimeError(f"a module backward {kind} on remote tensors returned new gradients: module backward "
                           "hooks run on the client after the server's backward, on the gradients torch would "
                           "give them, so they may read and store them but not replace them; register a "
                           f"Tensor.register_hook on the module's output or input instead ({at})")
