"""``Recorder``: what a graph's torch calls are queued into while the remote backend records them
(``capture/_translate``), and a user Function's backward while the SDK records it
(``dispatch/_user_functions``).

The backend runs the graph's remote nodes once, through the SDK's own eager path (``call_op``, the
handlers), on handles whose session is a ``Recorder``: every step the SDK would send for those calls
lands in the recorder instead of a queue, named by the recorder (``v0``, ``v1``, ...), and becomes a
step of the template. So a template holds exactly the steps eager code would send for the same
calls: the same routes, arguments, in-place spellings and grad modes.

Where eager code would wait for the server (an op whose outputs only the server can describe, an
``allow_unused`` grad), the recorder answers from the graph's own metadata (the node's
``example_value``); where it would need a value on the client, or send a step a template may not
hold (a ``put``, a ``fetch``), the graph cannot be a template (``Untranslatable``).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from remote_autograd.proto import dtype_name
from remote_autograd.proto.messages import SetGradStep

from ._steps import make_step

TEMPLATE_STEP_KINDS = frozenset({"call", "grad", "backward", "set_grad", "set_requires_grad", "functorch"})


class Untranslatable(Exception):
    """The graph cannot run as a template (the backend runs it call by call instead, saying why)."""


class Recorder:
    """A session as far as the SDK's eager path asks one, that keeps the steps it is given."""

    pipeline = True
    _closed = False

    def __init__(self, session: Any) -> None:
        self.device: torch.device = session.device
        self._routes = session._routes
        self.remote_device = session.remote_device
        self.limits = session.limits
        self._grad_tracked: dict = {}
        self.new_id: Callable[[], str] = map("v{}".format, itertools.count()).__next__  # "v0", ... (SessionCore's way)
        self.steps: list[dict] = []
        self.node: Any = None  # the FX node being recorded: its example value answers take_result
        self._session_hooked = getattr(session, "_hooked", None)
        self._session_node_hooks = getattr(session, "_node_hooks", None)

    @property
    def _hooked(self) -> dict:
        """The hooked tensors a recorded backward would record hooks for (``handlers/_hooks``): a graph's
        backward with the session's tensors hooked cannot be a template (its calls then run one by one)."""
        if self._session_hooked:
            raise Untranslatable("a tensor of the session has hooks (register_hook), which a template's backward "
                                 "would not run")
        return {}

    @property
    def _node_hooks(self) -> dict:
        """Likewise for module backward hooks (``handlers/_node_hooks``)."""
        if self._session_node_hooks:
            raise Untranslatable("a module of the session has backward hooks (register_full_backward_hook), which "
                                 "a template's backward would not run")
        return {}

    # torch's settings (``SessionCore``'s, from ``_steps``' ``QueueGlobals``): a template's steps are recorded
    # under the default dtype dynamo guards, and the program that runs it carries the settings of the
    # call (``_compiled``); anomaly detection is the call's too, never recorded into the template.
    _queue_dtype: torch.dtype | None = None

    def globals_changed(self, dtype: torch.dtype) -> None:
        self._queue_dtype = dtype

    def autograd_fields(self) -> dict:
        return {}

    def enqueue(self, step: dict, origin: Any = None, nbytes: int = 0) -> int:
        kind = step["kind"]
        if kind not in TEMPLATE_STEP_KINDS:
            what = "a local tensor it uploads" if kind == "put" else f"a {kind} step"
            raise Untranslatable(f"the graph needs {what}, which a template cannot hold")
        self.steps.append(step)
        return len(self.steps) - 1

    def clear_grad(self, tid: str, line: str | None) -> None:
        """``.grad = None`` in a graph: a ``set_grad`` step of the template (``SessionCore.clear_grad``'s merging
        is the queue's)."""
        self.enqueue(make_step(SetGradStep, id=tid, grad=None))

    def take_result(self, index: int) -> dict:
        """The result the server would give step ``index`` (a step eager code waits for), from the graph."""
        step = self.steps[index]
        example = None if self.node is None else self.node.meta.get("example_value")
        if step["kind"] == "call" and step.get("out_many"):  # outputs only the server could describe
            outs = list(example) if isinstance(example, (tuple, list)) else [example]
            step.pop("out_many")
            step["out"] = [self.new_id() for _ in outs]
            return {"tensors": [_meta(tid, o) for tid, o in zip(step["out"], outs)],
                    "tuple": isinstance(example, (tuple, list))}
        if step["kind"] == "grad" and isinstance(example, (tuple, list)):  # which grads allow_unused leaves None
            return {"tensors": [None if g is None else _meta(tid, g) for tid, g in zip(step["out"], example)]}
        raise Untranslatable(f"the graph waits for the server's answer to a {step['kind']} step")

    def flush(self) -> list:
        raise Untranslatable("the graph needs a value on the client (a read of a remote tensor's values)")

    def fetch(self, tid: str, **kwargs) -> dict:
        return self.flush()

    def _free_later(self, tid: str) -> None:
        pass  # the recording's handles name tensors of the template, which a run frees itself


def _meta(tid: str, t: Any) -> dict:
    if not isinstance(t, torch.Tensor):
        raise Untranslatable(f"an op of the graph returns {type(t).__name__} where the SDK expects a tensor")
    return {"id": tid, "dtype": dtype_name(t.dtype), "shape": [int(d) for d in t.shape],
            "requires_grad": t.requires_grad}
