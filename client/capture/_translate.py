"""A graph dynamo captured, made a template once (``translate``) and what each call does (``Plan``).

Each node of the FX graph is either **remote** (it makes or writes remote tensors: its
``example_value`` holds a RemoteTensor, or it returns nothing and reads one) or **local** (sizes,
numbers, CPU tensors: an optimizer's step count, the value of a float dynamo lifted into an input).

- Remote nodes run once, now, through the SDK's eager path on handles whose session is a
  ``Recorder`` (``session/_recorder``): their steps are the template's. The graph's global state (grad mode,
  autocast) is set as the graph sets it while they run, so the steps carry it.
- Local nodes run on every call, on the call's real arguments (``Plan.run_locals``). What a remote
  node takes from them reaches the template as a number (``{scalar}``): a size or a Python number as
  itself, a 0-d CPU tensor as its value, which a ``full`` step of the template makes the 0-d tensor
  eager code would have uploaded (an exact value: float64 on the wire holds every float dtype's);
  another CPU tensor is uploaded by each call (a ``put`` before the run), as eager code does.
- A local node that reads a size of a remote tensor the graph made (dynamic shapes) is evaluated from
  its symbolic expression (``_symbols``), as are the outputs' shapes.

What cannot be a template raises ``Untranslatable`` (the backend then runs the graph call by call):
a read of a remote tensor's values, a step kind a template cannot hold, a module call.

The SDK's bookkeeping comes from the recording too: each output's ``requires_grad``, whether it is a
leaf and which inputs' leaves it depends on (its handle's leaves name the inputs), which input it is a
view of, and how many times the graph wrote each input in place (its version counter).
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.fx.node import map_aggregate
from torch.utils._pytree import tree_leaves

from remote_autograd.proto import dtype_name
from remote_autograd.proto.messages import TemplateStep

from .._core import RemoteTensor, call_op
from ..device._device import DEVICE_TYPE, recording_into
from ..session._recorder import Recorder, Untranslatable
from ..session._steps import OMIT, make_step
from ..tensor import _views
from . import _functorch, _symbols
from ._symbols import Symbols, hint, is_symbolic

# Global state a graph sets for the calls after it: set while recording, and set again by each call
_GLOBAL_STATE = {torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast,
                 torch.amp.autocast_mode._exit_autocast}
_TEMPLATE_IDS = itertools.count(1)
_PROCESS = secrets.token_hex(3)


class _Local:
    """A local node's value, known per call (``Plan.run_locals``)."""

    __slots__ = ("node",)

    def __init__(self, node) -> None:
        self.node = node


class _FloatRef(float):
    """A number a call gives, while recording: its example value, and the template scalar it is."""


class _IntRef(int):
    """As ``_FloatRef``, for an integer."""


@dataclass
class OutputSpec:
    """Template output ``j``: what each call makes a handle of."""

    shape: tuple  # ints, or symbolic sizes evaluated per call
    dtype: torch.dtype
    requires_grad: bool
    is_leaf: bool
    leaves: tuple[int, ...]  # the remote inputs whose leaves it depends on
    strides: Any  # the handle's _strides (None: contiguous)
    view_of: int | None = None  # the remote input whose memory it views
    differentiable_view: bool = False


@dataclass
class Plan:
    """A graph's template and what each call of it does."""

    template: dict
    remote: list = field(default_factory=list)  # per remote input: ("arg", k) or ("attr", name): where a call finds it
    inputs: list = field(default_factory=list)  # per template input: ("remote", r) or ("upload", node)
    scalars: list = field(default_factory=list)  # per template scalar: (node or ("arg", k), path, how)
    outputs: list[OutputSpec] = field(default_factory=list)
    results: list = field(default_factory=list)  # per graph output: ("input", r) | ("out", j) | ("local", node) | ("const", v)
    locals: list = field(default_factory=list)  # local nodes run by each call, in order
    symbolic_locals: set = field(default_factory=set)  # those evaluated from their expressions
    bumps: list = field(default_factory=list)  # (remote input, times written in place, requires grad after, leaves of)
    symbols: Symbols = field(default_factory=Symbols)
    dynamic: bool = False

    @property
    def autograd(self) -> bool:
        """Whether the template runs a backward or a grad (anomaly detection would check its nodes)."""
        return any(step["kind"] in ("backward", "grad") for step in self.template["steps"])


def translate(gm: torch.fx.GraphModule, session: Any, mode: str | None) -> Plan:
    """``gm``'s template (``Untranslatable`` when it cannot be one)."""
    return _Translation(gm, session).run(mode)


class _Translation:
    def __init__(self, gm: torch.fx.GraphModule, session: Any) -> None:
        self.gm, self.session = gm, session
        self.recorder = Recorder(session)
        self.regions = _functorch.Regions(self.recorder)
        self.env: dict = {}
        self.placeholders: list = []
        self.remote_of: dict[int, int] = {}  # id(handle) -> its number among the graph's remote inputs
        self.made_by: dict[int, Any] = {}  # id(handle) -> the node whose example value it is
        self.brought: dict = {}  # local node -> what remote calls take of it
        self.plan = Plan(template={})
        self.inputs: list[dict] = []
        self.scalars: list[dict] = []

    def run(self, mode: str | None) -> Plan:
        plan = self.plan
        grad_mode = torch.is_grad_enabled()
        try:
            with recording_into(self.session.device, self.recorder):
                nodes = list(self.gm.graph.nodes)
                for k, n in enumerate(n for n in nodes if n.op == "placeholder"):
                    self.placeholders.append(n)
                    self.env[n] = self._placeholder(n, k)
                before = {id(h): _facts(h) for h in self._input_handles()}
                for n in nodes:
                    if n.op == "placeholder":
                        continue
                    self.recorder.node = n
                    if n.op == "output":
                        self.regions.finish()
                        self._output(n)
                    else:
                        self.env[n] = self._node(n)
        finally:
            torch.set_grad_enabled(grad_mode)
        self._bumps(before)
        tid = f"c{_PROCESS}-{next(_TEMPLATE_IDS)}"
        plan.template = make_step(TemplateStep, id=tid, inputs=self.inputs, scalars=self.scalars,
                                  steps=[_with_scalars(s) for s in self.recorder.steps],
                                  outputs=[self._output_names[j] for j in range(len(plan.outputs))],
                                  mode=OMIT if mode is None else mode)
        if not plan.template["steps"]:
            raise Untranslatable("the graph makes no remote call")
        return plan

    # -- inputs ---------------------------------------------------------------------------------

    def _input_handles(self) -> list:
        return [v for v in self.env.values() if isinstance(v, RemoteTensor) and id(v) in self.remote_of]

    def _placeholder(self, n, k: int) -> Any:
        example = n.meta.get("example_value")
        self.plan.symbols.learn_input(example, k)
        if isinstance(example, RemoteTensor):
            with DisableTorchFunctionSubclass():  # a traced wrapper: its C++ facts are the fake's
                facts = (tuple(example.shape), tuple(example.stride()), example.dtype, example.requires_grad,
                         example.is_leaf)
            return self._remote_input(("arg", k), *facts, declared=example)
        if isinstance(example, torch.Tensor) and example.device.type == DEVICE_TYPE:
            raise Untranslatable("a graph input on the remote device that is no RemoteTensor")
        return _Local(n)

    def _remote_input(self, binding: tuple, shape: tuple, stride: tuple, dtype: torch.dtype, rg: bool, leaf: bool,
                      declared: Any) -> RemoteTensor:
        """A remote tensor the graph takes (an argument, or a tensor dynamo keeps as a graph attribute: an
        optimizer's parameters): a template input, and a handle of the recording that stands for it."""
        r = len(self.plan.remote)
        name = f"i{r}"
        shape = tuple(hint(d, 2) for d in shape)
        h = RemoteTensor._new(self.recorder, name, shape, dtype, requires_grad=rg, is_leaf=leaf or not rg,
                              leaves=frozenset({name}) if rg else frozenset())
        strides = tuple(hint(d, 1) for d in stride)
        if strides != _views.contiguous_strides(shape):
            h._strides = strides
        self.remote_of[id(h)] = r
        self.plan.remote.append(binding)
        self.plan.inputs.append(("remote", r))
        self.inputs.append(_declared(name, declared, dtype, rg))
        return h

    # -- nodes ----------------------------------------------------------------------------------

    def _node(self, n) -> Any:
        if n.op == "get_attr":
            value = getattr(self.gm, n.target)
            if isinstance(value, RemoteTensor):  # dynamo keeps an optimizer's parameters and state as attributes
                return self._remote_input(("attr", n.target), value._shape, _views.strides(value), value._dtype,
                                          value._rg, value._is_leaf or not value._rg, declared=value)
            if isinstance(value, torch.Tensor):
                self.plan.locals.append(n)
                return _Local(n)
            raise Untranslatable(f"a graph attribute {n.target!r} of type {type(value).__name__}")
        if n.op == "call_module":
            raise Untranslatable(f"a module call ({n.target}) left in the graph")
        if n.op == "call_function" and _functorch.is_functorch(n.target):  # torch.func's vmap, grad: recorded
            args, kwargs = map_aggregate((n.args, n.kwargs), self._functorch_arg)
            out = self.regions.call(n, args, kwargs)
            for h in tree_leaves(out):
                if isinstance(h, RemoteTensor):
                    self.made_by.setdefault(id(h), n)
            return out
        if n.target in _GLOBAL_STATE:
            self.plan.locals.append(n)  # each call sets it too, for its local part
            args, kwargs = map_aggregate((n.args, n.kwargs), self._constant_arg)
            return self._call(n, args, kwargs)
        example = n.meta.get("example_value")
        if self._is_remote(n, example):
            args, kwargs = map_aggregate((n.args, n.kwargs), self._remote_arg)
            out = self._call(n, args, kwargs)
            for h in tree_leaves(out):
                if isinstance(h, RemoteTensor):
                    self.made_by.setdefault(id(h), n)
            return out
        self._local(n, example)
        return _Local(n)

    def _call(self, n, args, kwargs) -> Any:
        if n.op == "call_function":
            return n.target(*args, **kwargs)
        self_arg, *rest = args
        return getattr(self_arg, n.target)(*rest, **kwargs)

    def _is_remote(self, n, example) -> bool:
        tensors = [t for t in tree_leaves(example) if isinstance(t, torch.Tensor)]
        if any(_remote_tensor(t) for t in tensors):
            return True
        reads_remote = any(_holds_remote(self.env.get(a)) for a in n.all_input_nodes)
        if tensors and reads_remote:
            raise Untranslatable(f"{_name(n)} reads a remote tensor's values on the client")
        return example is None and reads_remote

    def _local(self, n, example) -> None:
        """A local node: run by each call, or evaluated from its expression when it reads a size of a
        remote tensor the graph made."""
        reads_made = any(_holds_remote(self.env.get(a)) and a not in self.placeholders for a in n.all_input_nodes)
        if reads_made:
            values = tree_leaves(example)
            if not all(isinstance(v, (int, float, bool)) or self.plan.symbols.can_evaluate(v) for v in values):
                raise Untranslatable(f"{_name(n)} reads a remote tensor the graph made, in a way no size says")
            self.plan.symbolic_locals.add(n)
        self.plan.locals.append(n)
        self.plan.symbols.learn_local(example, n)
        if any(is_symbolic(v) for v in tree_leaves(example)):
            self.plan.dynamic = True

    def _constant_arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            value = self.env[a]
            if isinstance(value, _Local):
                raise Untranslatable(f"{_name(a)} sets global state from a value of the call")
            return value
        return a

    def _functorch_arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node) and isinstance(self.env[a], _Local):
            if not isinstance(a.meta.get("example_value"), torch.SymInt):
                raise Untranslatable(f"a torch.func call takes {_name(a)}, a value of the call")
            return self._remote_arg(a)  # vmap's batch size, traced dynamic: a number of each call
        return self.env[a] if isinstance(a, torch.fx.Node) else a

    # -- what remote calls take of local values -------------------------------------------------

    def _remote_arg(self, a: Any) -> Any:
        if not isinstance(a, torch.fx.Node):
            return a
        value = self.env[a]
        if not isinstance(value, _Local):
            return value
        if a not in self.brought:
            self.brought[a] = self._bring(a, a.meta.get("example_value") if a.op != "get_attr"
                                          else getattr(self.gm, a.target), ())
        return self.brought[a]

    def _bring(self, node, example: Any, path: tuple) -> Any:
        if isinstance(example, torch.Tensor):
            if example.requires_grad:
                raise Untranslatable(f"a local tensor that requires grad ({_name(node)}) used with remote ones")
            if example.dim() == 0 and not (example.is_complex()):
                how = "float" if example.is_floating_point() else "int"
                marker = self._scalar(node, path, how, 1.0 if how == "float" else 1, item=True)
                return call_op(self.recorder, "full", [(), marker], {"dtype": example.dtype})
            name = f"u{len(self.inputs)}"
            h = RemoteTensor._new(self.recorder, name, tuple(hint(d, 2) for d in example.shape), example.dtype)
            self.plan.inputs.append(("upload", node))
            self.inputs.append(_declared(name, example, example.dtype, False))
            return h
        if isinstance(example, (list, tuple)):  # a torch.Size, a list of sizes
            return tuple(self._bring(node, e, (*path, i)) for i, e in enumerate(example))
        if isinstance(example, (torch.SymBool, bool)):
            raise Untranslatable(f"a boolean the call computes ({_name(node)}) as an argument of a remote op")
        if isinstance(example, (torch.SymInt, int)):
            return self._scalar(node, path, "int", hint(example, 2))
        if isinstance(example, (torch.SymFloat, float)):
            return self._scalar(node, path, "float", hint(example, 1.0))
        if example is None:
            return None
        raise Untranslatable(f"a value of type {type(example).__name__} ({_name(node)}) as an argument of a remote op")

    def _scalar(self, node, path: tuple, kind: str, example: Any, item: bool = False) -> Any:
        name = f"s{len(self.scalars)}"
        self.scalars.append({"id": name, "kind": kind})
        self.plan.scalars.append((node, path, kind, item))
        marker = (_FloatRef if kind == "float" else _IntRef)(example)
        marker.name = name
        return marker

    # -- outputs --------------------------------------------------------------------------------

    def _output(self, n) -> None:
        self._output_names: list[str] = []
        outs: dict[int, int] = {}
        for a in n.args[0]:
            value = self.env[a] if isinstance(a, torch.fx.Node) else a
            if isinstance(value, RemoteTensor):
                if id(value) in self.remote_of:
                    self.plan.results.append(("input", self.remote_of[id(value)]))
                elif value._id in {i["id"] for i in self.inputs} or id(value) in {id(b) for b in self.brought.values()}:
                    self.plan.results.append(("local", a))  # a local value that remote calls took: itself
                elif id(value) in outs:
                    self.plan.results.append(("out", outs[id(value)]))
                else:
                    outs[id(value)] = len(self.plan.outputs)
                    self.plan.results.append(("out", outs[id(value)]))
                    self._output_names.append(value._id)
                    self.plan.outputs.append(self._output_spec(value))
            elif isinstance(value, _Local):
                self.plan.results.append(("local", a))
            elif isinstance(a, torch.fx.Node) and value is not None and not isinstance(value, (int, float, bool, str)):
                raise Untranslatable(f"the graph returns {type(value).__name__}")
            else:
                self.plan.results.append(("const", value))

    def _output_spec(self, h: RemoteTensor) -> OutputSpec:
        node = self.made_by.get(id(h))
        example = node.meta.get("example_value") if node is not None else None
        shape = tuple(h._shape)
        traced = self.regions.shapes.get(id(h)) or (tuple(example.shape) if isinstance(example, torch.Tensor) else ())
        if any(is_symbolic(d) for d in traced):
            if not all(self.plan.symbols.can_evaluate(d) for d in traced):
                raise Untranslatable("an output's size the call's inputs do not say")
            shape = traced
            self.plan.dynamic = True
        leaves = self._leaves_of(h)
        spec = OutputSpec(shape, h._dtype, h._rg, h._is_leaf, leaves,
                          _views.UNKNOWN if self.plan.dynamic and h._strides is not None else h._strides)
        storage = h._storage
        if storage is not None:
            for member in storage.alive():
                k = self.remote_of.get(id(member))
                if k is not None:
                    spec.view_of = k
                    spec.differentiable_view = h._view_of is not None
                    break
        return spec

    def _leaves_of(self, h: RemoteTensor) -> tuple[int, ...]:
        """The remote inputs whose leaves ``h`` depends on (its leaves name them: ``i<r>``)."""
        return tuple(sorted(r for r in range(len(self.plan.remote)) if f"i{r}" in h._leaves))

    def _bumps(self, before: dict) -> None:
        """The inputs the graph wrote in place: how many times, and whether that recorded a graph on them.
        Any other change of an input's facts would have to be made on each call's handles: refused."""
        for h in self._input_handles():
            version, autograd, layout, has_grad = before.get(id(h), _facts(h))
            times = _views.version(h) - version
            if layout != _facts(h)[2]:
                raise Untranslatable("the graph changes an input's shape or strides in place")
            if has_grad != h._has_grad:
                raise Untranslatable("the graph sets an input's .grad")
            recorded = autograd != _facts(h)[1]
            if recorded and not times:
                raise Untranslatable("the graph changes an input's requires_grad")
            if times:
                self.plan.bumps.append((self.remote_of[id(h)], times, recorded, self._leaves_of(h)))


def _facts(h: RemoteTensor) -> tuple:
    """What a call's input handle must match after the graph ran: version, autograd facts, layout, grad."""
    return _views.version(h), (h._rg, h._is_leaf, h._leaves), (h._shape, h._dtype, h._strides), h._has_grad


def _declared(name: str, example: torch.Tensor, dtype: torch.dtype, requires_grad: bool) -> dict:
    """A template input's declaration: a size dynamo made symbolic is any size (``null``)."""
    with DisableTorchFunctionSubclass():
        shape = example.shape
    return {"id": name, "dtype": dtype_name(dtype), "requires_grad": requires_grad,
            "shape": [None if is_symbolic(d) else int(d) for d in shape]}


def _remote_tensor(t: torch.Tensor) -> bool:
    return isinstance(t, RemoteTensor) or t.device.type == DEVICE_TYPE


def _holds_remote(value: Any) -> bool:
    return any(isinstance(v, RemoteTensor) for v in tree_leaves(value)) if value is not None else False


def _name(n) -> str:
    target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
    return f"{n.name} ({target})"


def _with_scalars(value: Any) -> Any:
    """A recorded step with each number a call gives written as ``{scalar: name}``."""
    kind = type(value)
    if kind is _FloatRef or kind is _IntRef:
        return {"scalar": value.name}
    if kind is dict:
        return {k: _with_scalars(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_with_scalars(v) for v in value]
    return value


