"""``torch.func`` transforms in a captured graph: ``vmap`` and ``grad`` recorded as ``functorch`` steps.

Dynamo (torch 2.13) inlines ``torch.func.vmap`` and ``grad`` (``jacrev``, ``vjp``, ``grad_and_value``) into
a flat graph of functorch's own calls around ordinary torch calls: ``_vmap_increment_nesting(batch,
randomness)``, ``_add_batch_dim(x, in_dim, level)``, ``_grad_increment_nesting()``, ``_wrap_for_grad(t,
level)``, ``_set_tensor_requires_grad(t)``, ``_autograd_grad(outputs, inputs, create_graph=True)``,
``_unwrap_for_grad``, ``_remove_batch_dim(t, level, batch, out_dim)`` and the two decrements. ``Regions``
records each as a step of the template (``proto/SPEC.md`` §5, ``functorch``), which the server runs with
torch's own functorch (``service/engine/functorch_regions``), levels its own.

The ordinary calls between them are recorded as eager code would send them, on handles of the
*logical* layouts torch's transforms give the function: ``_add_batch_dim`` drops the batched dim,
``_remove_batch_dim`` puts the batch back at ``out_dim``; a grad region's tensors keep their layouts
(``_wrap_for_grad`` makes a fresh one that needs no grad until ``_set_tensor_requires_grad``).

Forward-mode transforms (``jvp``, ``jacfwd``, ``hessian``) and ``functionalize`` put other functorch
calls in the graph: refused (``Untranslatable``) naming them. A graph with any functorch call must not
run call by call on the client (its increments would push torch.func interpreters onto this
process's stack around ops that refuse), so the backend makes such a graph raise instead
(``refuses_locally``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._functorch import eager_transforms, predispatch

from remote_autograd.proto.messages import FunctorchStep

from .._core import RemoteTensor
from ..session._recorder import Untranslatable
from ..session._steps import make_step
from ..tensor._autograd_flags import set_requires_grad_flag

_C = torch._C._functorch
# what each functorch call of a graph is recorded as (both spellings dynamo may write)
_FNS: dict[Any, str] = {
    predispatch._vmap_increment_nesting: "vmap_enter", _C._vmap_increment_nesting: "vmap_enter",
    predispatch._vmap_decrement_nesting: "vmap_exit", _C._vmap_decrement_nesting: "vmap_exit",
    predispatch._add_batch_dim: "add_batch_dim", _C._add_batch_dim: "add_batch_dim",
    predispatch._remove_batch_dim: "remove_batch_dim", _C._remove_batch_dim: "remove_batch_dim",
    _C._grad_increment_nesting: "grad_enter", _C._grad_decrement_nesting: "grad_exit",
    _C._wrap_for_grad: "wrap_for_grad", predispatch._unwrap_for_grad: "unwrap_for_grad",
    _C._unwrap_for_grad: "unwrap_for_grad",
    eager_transforms._set_tensor_requires_grad: "requires_grad", eager_transforms._autograd_grad: "autograd_grad",
}
# calls that set this process's functorch flags around the region's: the server's region sets its own
_IGNORED = {predispatch.lazy_load_decompositions, _C.set_inplace_requires_grad_allowed,
            torch._C._autograd._saved_tensors_hooks_disable, torch._C._autograd._saved_tensors_hooks_enable}


def is_functorch(target: Any) -> bool:
    """Whether a graph's call is functorch's own (recorded here, ignored, or refused)."""
    if target in _FNS or target in _IGNORED:
        return True
    module = getattr(target, "__module__", None) or ""
    return module.startswith(("torch._functorch", "torch._C._functorch")) or target in _FORWARD_AD


_FORWARD_AD = {getattr(torch._C._functorch, name, None) for name in ("_jvp_increment_nesting", "_jvp_decrement_nesting",
                                                                       "_func_increment_nesting",
                                                                       "_func_decrement_nesting")} - {None}


def refuses_locally(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` has functorch calls (it must then never run call by call on the client)."""
    return any(n.op == "call_function" and is_functorch(n.target) for n in gm.graph.nodes)


class Regions:
    """The open regions of a graph being recorded into ``recorder``, and what each functorch call records."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        # (kind, vmap's batch size, the leaves of what entered a grad region)
        self.frames: list[tuple[str, int | None, frozenset]] = []
        self.graded = False  # a grad region is in the outermost region open (or last closed)
        self.shapes: dict[int, tuple] = {}  # id(handle) -> its traced shape where dynamo's example says less

    def call(self, n: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
        """Record functorch call ``n`` (its arguments resolved: handles, numbers); its value in the recording."""
        target = n.target
        if target in _IGNORED:
            return None
        fn = _FNS.get(target)
        if fn is None:
            name = getattr(target, "__name__", str(target))
            raise Untranslatable(f"a torch.func call the remote backend does not run ({name}): forward-mode "
                                 "transforms (jvp, jacfwd, hessian) and functionalize are not supported; vmap, "
                                 "grad, grad_and_value, vjp and jacrev are")
        return getattr(self, "_" + fn)(n, *args, **kwargs)

    # -- regions ----------------------------------------------------------------------------------

    def _vmap_enter(self, n, batch: Any, randomness: Any) -> int:
        if not isinstance(batch, int) or isinstance(batch, bool):
            raise Untranslatable(f"vmap's batch size {batch!r}")
        if not self.frames:
            self.graded = False
        self._enqueue(fn="vmap_enter", batch=batch, randomness=randomness)  # a size traced dynamic: a scalar
        self.frames.append(("vmap", int(batch), frozenset()))
        return len(self.frames)

    def _grad_enter(self, n) -> int:
        self.graded = True
        self._enqueue(fn="grad_enter")
        self.frames.append(("grad", None, frozenset()))
        return len(self.frames)

    def _vmap_exit(self, n) -> int:
        return self._exit("vmap")

    def _grad_exit(self, n) -> int:
        return self._exit("grad")

    def _exit(self, kind: str) -> int:
        if not self.frames or self.frames[-1][0] != kind:
            raise Untranslatable(f"a torch.func {kind} region the graph closes out of order")
        self.frames.pop()
        self._enqueue(fn=f"{kind}_exit")
        return len(self.frames) + 1

    # -- tensors in and out -----------------------------------------------------------------------

    def _add_batch_dim(self, n, x: Any, dim: int, level: int) -> RemoteTensor:
        self._innermost("vmap", level)
        shape = list(self._handle(x)._shape)
        if type(dim) is not int or not -len(shape) <= dim < len(shape):
            raise Untranslatable(f"vmap's in_dim {dim!r} of a tensor of {len(shape)} dims")
        del shape[dim]
        return self._into(n, "add_batch_dim", x, tuple(shape), x._rg, x._leaves, dim=dim)

    def _wrap_for_grad(self, n, t: Any, level: int) -> RemoteTensor:
        self._innermost("grad", level)
        self._entered(self._handle(t))
        return self._into(n, "wrap_for_grad", t, t._shape, False, frozenset())

    def _remove_batch_dim(self, n, t: Any, level: int, batch: Any, out_dim: Any) -> RemoteTensor:
        self._innermost("vmap", level)
        shape = list(self._handle(t)._shape)
        if type(out_dim) is not int or not -len(shape) - 1 <= out_dim <= len(shape):
            raise Untranslatable(f"vmap's out_dim {out_dim!r} for a result of {len(shape)} dims")
        at = out_dim % (len(shape) + 1)
        shape.insert(at, self.frames[-1][1])
        h = self._out_of(n, "remove_batch_dim", t, tuple(shape), dim=out_dim)
        example = n.meta.get("example_value")
        traced = n.args[2].meta.get("example_value") if isinstance(n.args[2], torch.fx.Node) else None
        if isinstance(example, torch.Tensor) and isinstance(traced, torch.SymInt):
            # dynamo gives the result's batched dim a symbol of its own: the output's shape names vmap's
            self.shapes[id(h)] = (*example.shape[:at], traced, *example.shape[at + 1:])
        return h

    def _unwrap_for_grad(self, n, t: Any, level: int) -> RemoteTensor:
        self._innermost("grad", level)
        return self._out_of(n, "unwrap_for_grad", t, self._handle(t)._shape)

    def _into(self, n, fn: str, x: RemoteTensor, shape: tuple, rg: bool, leaves: frozenset, **extra) -> RemoteTensor:
        name = self.recorder.new_id()
        self._enqueue(fn=fn, id=x._id, out=[name], **extra)
        return RemoteTensor._new(self.recorder, name, shape, x._dtype, requires_grad=rg, is_leaf=not rg,
                                 leaves=leaves if rg else frozenset())

    def _out_of(self, n, fn: str, t: RemoteTensor, shape: tuple, **extra) -> RemoteTensor:
        """A tensor brought out of the innermost region: it needs grad out there where torch's does, and then
        depends on what entered the region."""
        example = n.meta.get("example_value")
        rg = bool(isinstance(example, torch.Tensor) and example.requires_grad)
        if rg and len(self.frames) == 1 and self.graded:  # the server runs grad regions without counting their graph
            raise Untranslatable("torch.func.grad's result requires grad outside the transform (its inputs do): "
                                 "differentiating through torch.func.grad is not supported on remote tensors; "
                                 "detach what the transform takes ({k: v.detach() for k, v in "
                                 "model.named_parameters()}, as torch's per-sample-gradients tutorial does)")
        name = self.recorder.new_id()
        self._enqueue(fn=fn, id=t._id, out=[name], **extra)
        # vmap adds no level of autograd: the result depends on the leaves its per-sample value does (a tensor
        # the function closes over among them); a grad region's, on what entered it too (its own leaves
        # name none of the graph's inputs)
        kind, _, entered = self.frames[-1]
        leaves = t._leaves if kind == "vmap" else t._leaves | entered
        return RemoteTensor._new(self.recorder, name, shape, t._dtype, requires_grad=rg, is_leaf=not rg,
                                 leaves=leaves if rg else frozenset())

    # -- grad's own calls -------------------------------------------------------------------------

    def _requires_grad(self, n, t: Any) -> RemoteTensor:
        if not self.frames or self.frames[-1][0] != "grad":
            raise Untranslatable("torch.func's requires_grad outside a grad region")
        h = self._handle(t)
        self._enqueue(fn="requires_grad", id=h._id)
        h._rg, h._is_leaf, h._leaves = True, True, frozenset({h._id})  # a leaf of the region's graph
        set_requires_grad_flag(h, True)
        return h  # as torch's (vjp's graph names its result)

    def _autograd_grad(self, n, outputs: Any, inputs: Any, grad_outputs: Any = None, *, retain_graph: bool = False,
                       create_graph: bool = True) -> tuple:
        outputs, inputs = [self._handle(o) for o in outputs], [self._handle(i) for i in inputs]
        names = [self.recorder.new_id() for _ in inputs]
        extra = {} if grad_outputs is None else {"grad_outputs": [self._handle(g)._id for g in grad_outputs]}
        self._enqueue(fn="autograd_grad", outputs=[o._id for o in outputs], inputs=[i._id for i in inputs],
                      out=names, retain_graph=bool(retain_graph), create_graph=bool(create_graph), **extra)
        examples = n.meta.get("example_value")
        leaves = frozenset().union(*(i._leaves for i in inputs))
        grads = []
        for k, (name, i) in enumerate(zip(names, inputs)):
            example = examples[k] if isinstance(examples, (tuple, list)) and k < len(examples) else None
            rg = bool(isinstance(example, torch.Tensor) and example.requires_grad)
            grads.append(RemoteTensor._new(self.recorder, name, i._shape, i._dtype, requires_grad=rg, is_leaf=not rg,
                                           leaves=leaves if rg else frozenset()))
        return tuple(grads)

    # -- checks -----------------------------------------------------------------------------------

    def _innermost(self, kind: str, level: Any) -> None:
        """The call names the innermost region (as dynamo writes a transform's calls), of its kind."""
        if not self.frames or self.frames[-1][0] != kind or level != len(self.frames):
            raise Untranslatable(f"a torch.func call at level {level!r} of a region other than the innermost {kind}")

    def _entered(self, x: RemoteTensor) -> None:
        kind, batch, leaves = self.frames[-1]
        self.frames[-1] = (kind, batch, leaves | (x._leaves if x._rg else frozenset()))

    @staticmethod
    def _handle(x: Any) -> RemoteTensor:
        if not isinstance(x, RemoteTensor) or x._grad_owner is not None:
            raise Untranslatable(f"a torch.func call on {type(x).__name__} where the remote backend expects a tensor "
                                 "of the graph")
        return x

    def _enqueue(self, **step: Any) -> None:
        self.recorder.enqueue(make_step(FunctorchStep, **step))

    def finish(self) -> None:
        if self.frames:
            raise Untranslatable(f"a torch.func {self.frames[-1][0]} region the graph never closes")
