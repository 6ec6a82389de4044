"""``remote_backend``: the ``torch.compile`` backend named ``"remote"`` (registered by the package's entry
point ``torch_dynamo_backends``, so ``backend="remote"`` works once the SDK is installed).

Dynamo hands it each graph it captured, once, with fake example inputs. A graph with remote tensors
becomes a template (``_translate``) and each later call one ``run_template`` step (``CompiledGraph``).
A graph without any runs as dynamo gave it (local torch). A graph of one call (``return loss.detach()``
after a graph break) runs as that call, one eager step as without ``torch.compile``: as a template it
would be the same one step, with a definition and a binding of its inputs around it. A graph that
cannot be a template runs call by call through the SDK's eager path, exactly as without
``torch.compile``, and says so once.

``mode`` (``torch.compile``'s) travels with the template as a hint to the server, which may compile it
(``"default"`` is no hint); ``options`` are inductor's, which this backend has none of.

Dynamo must never compile the SDK's own frames, which a compiled region calls at run time (a
``.grad =`` its epilogue sets, an op after a graph break): traced there, ``__torch_function__`` would
take its tracing path on real handles. ``trace_rules.add`` marks the SDK's files as dynamo's own
skipped modules (as torch's are): dynamo runs them as they are, and never inlines them into a graph. All of
the package's folders: the SDK's frames call the wire's (``proto``), and the embedded app the service's.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch._dynamo import trace_rules

from .._core import RemoteTensor
from ..device._device import DEVICE_TYPE, session_for
from ..session._recorder import Untranslatable
from . import _functorch
from ._compiled import CompiledGraph
from ._translate import translate

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

for _package in ("remote_autograd", "remote_autograd.client", "remote_autograd.proto", "remote_autograd.service"):
    trace_rules.add(_package)  # each maps to a folder of its own (pyproject's package-dir)


def remote_backend(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = None,
                   options: dict | None = None) -> Any:
    """``torch.compile(fn, backend="remote")``: each graph dynamo captures, made a template of the session."""
    if mode not in MODES:
        raise ValueError(f"torch.compile(backend=\"remote\", mode={mode!r}): mode is one of {list(MODES[1:])}")
    if options:
        raise ValueError(f"torch.compile(backend=\"remote\", options=...): the remote backend takes no options "
                         f"(got {sorted(options)}); they are inductor's")
    device = _remote_device(gm)
    if device is None:
        return gm.forward  # nothing remote: local torch, as dynamo traced it
    session = session_for(device, "torch.compile(backend=\"remote\")")
    if _one_call(gm) and not _functorch.refuses_locally(gm):
        return gm.forward  # its one step, queued as eager code queues it
    try:
        plan = translate(gm, session, None if mode == "default" else mode)
    except Untranslatable as why:
        if _functorch.refuses_locally(gm):  # its increments would push torch.func levels onto this process's stack
            return _refused(f"torch.compile(backend=\"remote\"): a graph with torch.func transforms cannot run on "
                            f"the server: {why}")
        warnings.warn(f"torch.compile(backend=\"remote\"): a graph of {len(gm.graph.nodes)} nodes runs call by call "
                      f"(one step per op, as without torch.compile): {why}", RuntimeWarning, stacklevel=2)
        return gm.forward
    return CompiledGraph(plan, gm, device)


def _one_call(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` is a single call on its inputs."""
    return sum(n.op not in ("placeholder", "output") for n in gm.graph.nodes) == 1


def _refused(message: str) -> Any:
    """A compiled graph that raises ``message`` at each call, at the user's line (and runs nothing)."""
    def refuse(*args: Any) -> Any:
        raise RuntimeError(message)
    return refuse


def _remote_device(gm: torch.fx.GraphModule) -> torch.device | None:
    """The remote device a graph's tensors are on (an input's, or a factory's), or None."""
    for n in gm.graph.nodes:
        example = n.meta.get("example_value")
        for t in (example if isinstance(example, (tuple, list)) else (example,)):
            if isinstance(t, torch.Tensor):
                with DisableTorchFunctionSubclass():
                    device = t.device
                if isinstance(t, RemoteTensor) or device.type == DEVICE_TYPE:
                    return device
    return None
