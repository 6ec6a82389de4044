"""A template's steps as one FX graph, for a compiler (``template_compile``): the way torch's own
``torch.compile`` hands a graph to inductor.

The plain way a template runs (``templates.run_plainly``) sends each step through the runner's
handler. Here the same steps become the nodes of one ``torch.fx`` graph, built once per *variant*:
the template with the layouts of the tensors a run binds, its numbers (``{scalar}``) by value, and
which of its inputs hold a grad. Each ``call`` is a call of the callable the op table resolved for
its name (``OpTable.resolve``: what the runner calls), in the step's grad mode; an in-place name
the table computes out of place is that value copied into its target, as the runner does. A
``grad`` step is ``torch.autograd.grad``. A ``backward`` is ``torch.autograd.grad`` over the leaves
it fills, each grad then added into the grad the leaf holds (in place, under ``no_grad``, as
torch's accumulation does) or given to it. A ``set_grad`` of an input gives it a node's value or
clears it. The graph returns the template's outputs, then each grad a run must give an input
(``Effects``); every other change is an in-place write into an input, which the compiler keeps
(AOT autograd's functionalization writes the inputs back).

The graph is built on fake tensors of the variant's layouts (``FakeTensorMode``), step by step, so
the structure of each result (a tuple, its ``None``s, what requires grad) is torch's own. What a
graph cannot hold exactly raises ``Unfit`` and the template runs the plain way: a call that is not
``replayable``, a ``set_requires_grad``, a higher-order grad, a grad given to a tensor that is not
an input, an input that requires grad without being a leaf (its graph goes on outside the
template), inputs that share memory. An output that requires grad is the compiled graph's own (AOT
autograd traces the forward and its backward, compiled both before the variant is ready): a backward
step after the run goes through it, and a backward through that backward raises torch's own error
(compiled graphs support no double backward; the plain way does). A call whose entry has an argument contract (``OpEntry.check``: the fused optimizers', and
the value checks of the kernels that index memory) keeps it: the compiled run runs it first, on the
real values of the inputs and on fake tensors of the layouts of what the template computes
(``Check``); a contract that must read a computed value fails there, and the run goes the plain way.

A variant is only built after the same variant ran the plain way to its end (``compiled_templates``):
torch's argument checks, the element limits and the shapes of every step held for these layouts and
numbers then, and they depend on nothing else.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from remote_autograd.proto import dtype_from_name
from remote_autograd.proto.messages import BackwardStep, CallStep, GradStep, SetGradStep

from .. import ops as _ops
from ..ops._context import CURRENT, RunContext
from .replayable import replayable_call

_MAX_DEPTH = 8  # lists in lists, as values.resolve_value allows


class Unfit(Exception):
    """The variant cannot be one graph; the reason says why (it is logged)."""


class Layout(NamedTuple):
    """What a compiled variant assumes of one bound input: its value's layout, whether it requires grad
    (and is a leaf), its grad's layout (None: it has none), and whether that grad is also bound as an
    input's value (``grad_bound``: that input; an optimizer binds ``{grad_of: p}`` beside ``p``). A
    tuple: every run makes one per input and looks its variant up by them."""

    shape: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    requires_grad: bool
    is_leaf: bool
    grad: tuple | None  # (shape, stride, offset, dtype)
    grad_bound: int | None = None

    @classmethod
    def of(cls, value: torch.Tensor, grad: torch.Tensor | None, grad_bound: int | None = None) -> "Layout":
        # made by tuple's own constructor (a named tuple's is a Python call): every run makes one per input
        return tuple.__new__(cls, (value.shape, value.stride(), value.storage_offset(), value.dtype,
                                   value.requires_grad, value.is_leaf, None if grad is None else
                                   (grad.shape, grad.stride(), grad.storage_offset(), grad.dtype), grad_bound))


@dataclass(frozen=True)
class Input:
    """Where a check's argument is the value bound to input ``k``."""

    k: int


@dataclass(frozen=True)
class Check:
    """An argument contract (``entry.check``) run before the compiled graph: the call's ``args`` and
    ``kwargs`` with each input an ``Input``, each tensor the template computes its fake tensor."""

    check: Any
    args: tuple
    kwargs: dict

    def run(self, values: Sequence[torch.Tensor]) -> None:
        self.check(*_bound(self.args, values), **_bound(self.kwargs, values))


def _bound(value: Any, values: Sequence[torch.Tensor]) -> Any:
    if isinstance(value, Input):
        return values[value.k]
    if isinstance(value, (list, tuple)):
        return type(value)(_bound(v, values) for v in value)
    if isinstance(value, dict):
        return {k: _bound(v, values) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Effects:
    """What a run does to its inputs' grads after the graph: ``given`` (input, graph output, fresh) for
    each grad given to an input (its new ``.grad``; fresh: a backward's, which the runner clones where
    something else shares it, else a ``set_grad``'s, shared as torch shares it), ``cleared`` the inputs
    whose grad becomes None, ``grads_read`` the inputs whose grad (as the run found it) the graph takes
    as an argument, after the bound values."""

    given: tuple[tuple[int, int, bool], ...]
    cleared: tuple[int, ...]
    grads_read: tuple[int, ...]


@dataclass(frozen=True)
class TemplateGraph:
    module: fx.GraphModule
    outputs: int  # the template's outputs are the graph's first ``outputs`` results
    effects: Effects
    checks: tuple[Check, ...]
    mutates: bool  # a step writes into an input (or into an input's grad)
    # what every step makes, as if all of it lived at once (new storages: a view brings no bytes): a bound on
    # the run's peak, which a run charges before the graph runs (its steps free what they no longer need)
    made_bytes: int


def example_inputs(layouts: Sequence[Layout], grads_read: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """Tensors of the variant's layouts (values never read), in the graph's argument order: the bound
    values, then the grads it reads. Made here, never the session's: a compile touches no session."""
    values = [_tensor((lay.shape, lay.stride, lay.offset, lay.dtype), device).requires_grad_(lay.requires_grad)
              for lay in layouts]
    return values + [_tensor(layouts[k].grad, device) for k in grads_read]


def _tensor(layout: tuple, device: torch.device) -> torch.Tensor:
    """A tensor of ``layout`` that is no view in autograd's eyes (a leaf once it requires grad)."""
    shape, stride, offset, dtype = layout
    if not offset:
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    size = 1 + offset + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else offset
    return torch.empty(size, dtype=dtype, device=device).as_strided(shape, stride, offset).detach()


def build(template, layouts: Sequence[Layout], scalars: dict, device: torch.device) -> TemplateGraph:
    """The graph of ``template`` (its ``steps``, ``inputs`` and ``outputs``, names as the steps spell
    them) for runs binding inputs of ``layouts`` and numbers ``scalars``; ``Unfit`` if it cannot be one."""
    for k, lay in enumerate(layouts):
        if lay.requires_grad and not lay.is_leaf:
            raise Unfit(f"input {k} requires grad and is not a leaf: its graph goes on outside the template")
    token = CURRENT.set(RunContext(torch.default_generator, device))  # our factories read the device
    try:
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            return _Builder(template, layouts, scalars, device, mode).build()
    finally:
        CURRENT.reset(token)


class _Builder:
    def __init__(self, template, layouts: Sequence[Layout], scalars: dict, device, mode: FakeTensorMode) -> None:
        self.template, self.layouts, self.scalars, self.device, self.mode = template, layouts, scalars, device, mode
        self.graph = fx.Graph()
        self.nodes: dict[str, fx.Node] = {}
        self.fakes: dict[fx.Node, Any] = {}
        self.inputs: dict[str, int] = {name: k for k, name in enumerate(template.inputs)}
        self.grad_mode = True  # the runner's mode between steps
        # each input's grad as the steps so far left it: "start" (as the run found it), None, or a node
        self.grads: dict[int, Any] = {}
        self.grad_args: dict[int, fx.Node] = {}  # input -> the placeholder of its grad as found
        self.fresh: set[fx.Node] = set()  # grads a backward gave to an input that had none
        self.checks: list[Check] = []
        self.mutates = False
        examples = example_inputs(layouts, (), device)
        for k, (name, example) in enumerate(zip(template.inputs, examples)):
            node = self.graph.placeholder(f"input_{k}")
            self.nodes[name] = node
            self.fakes[node] = mode.from_tensor(example)
        self._last_placeholder = node if examples else None

    # -- the walk ----------------------------------------------------------------------------

    def build(self) -> TemplateGraph:
        for index, step in enumerate(self.template.steps):
            kind = type(step)
            try:
                if kind is CallStep:
                    self._call(step)
                elif kind is GradStep:
                    self._grad(step)
                elif kind is BackwardStep:
                    self._backward(step)
                elif kind is SetGradStep:
                    self._set_grad(step)
                else:
                    raise Unfit(f"a {step.kind} step")
            except Unfit as exc:
                raise Unfit(f"step {index}: {exc}") from None
            except Exception as exc:  # torch refused it on fake tensors: the runner will say how
                raise Unfit(f"step {index}: {type(exc).__name__}: {exc}") from None
        self._mode(True)
        # an output that requires grad carries the compiled graph's own backward (AOT autograd's), which a
        # backward step outside the template runs: torch.compile(model)'s forward, its backward eager
        outputs = [self._node(name) for name in self.template.outputs]
        given, cleared, results = [], [], list(outputs)
        for k, state in sorted(self.grads.items()):
            if state is None:
                cleared.append(k)
            elif state is not self.grad_args.get(k):  # a grad found and added to in place stays where it is
                if state not in results:
                    results.append(state)
                # an output that is also a grad given is one tensor, as the runner's set_grad shares it
                given.append((k, results.index(state), state in self.fresh))
        self.graph.output(tuple(results))
        module = fx.GraphModule(torch.nn.Module(), self.graph)
        found = {StorageWeakRef(self.fakes[n].untyped_storage()) for n in self.nodes.values() if n.op == "placeholder"}
        found |= {StorageWeakRef(self.fakes[n].untyped_storage()) for n in self.grad_args.values()}
        nbytes = 0
        for fake in _leaves(list(self.fakes.values())):  # new storages only: a view brings no bytes
            if isinstance(fake, torch.Tensor) and StorageWeakRef(fake.untyped_storage()) not in found:
                found.add(StorageWeakRef(fake.untyped_storage()))
                nbytes += fake.untyped_storage().nbytes()
        return TemplateGraph(module, len(outputs), Effects(tuple(given), tuple(cleared), tuple(self.grad_args)),
                             tuple(self.checks), self.mutates, nbytes)

    # -- steps -------------------------------------------------------------------------------

    def _call(self, step: CallStep) -> None:
        found = _ops.OP_TABLE.resolve(step.op)
        if found is None:
            raise Unfit(f"unknown op {step.op!r}")
        args = [self._value(v, 0) for v in step.args]
        kwargs = {k: self._value(v, 0) for k, v in step.kwargs.items()}
        if not replayable_call(found, step, self._plain(args), self._plain(kwargs)):
            raise Unfit(f"{step.op}: not a call a capture replays (random, data-dependent, autocast, out=, ...)")
        if found.entry.check is not None:
            self.checks.append(self._check(found.entry.check, args, kwargs))
        self._mode(step.grad_enabled)
        fn = found.fn
        if found.inplace:
            target = args[0]
            if isinstance(target, list) or found.writes:
                self._emit(fn, args, kwargs)
            else:  # computed out of place, then written in (step_kinds._inplace_by_copy)
                value = self._emit(fn, args, kwargs)
                if isinstance(self.fakes[value], (tuple, list)):
                    value = self._emit(operator.getitem, (value, 0), {})
                self._emit(torch.Tensor.copy_, (target, value), {})
            self.mutates = True  # into an input, or a view of one: a failed run cannot be run again
            return
        result = self._emit(fn, args, kwargs)
        fake = self.fakes[result]
        if isinstance(fake, (tuple, list)):
            outs = [self._emit(operator.getitem, (result, i), {}) for i, f in enumerate(fake) if f is not None]
        else:
            outs = [result]
        if len(outs) != len(step.out):
            raise Unfit(f"{step.op} returns {len(outs)} tensor(s) but out names {len(step.out)}")
        for name, node in zip(step.out, outs):
            if any(self.fakes[node] is self.fakes.get(a) for a in _leaves((args, kwargs)) if isinstance(a, fx.Node)):
                node = self._emit(torch.Tensor.view_as, (node, node), {})  # runner._no_aliases
            self.nodes[name] = node

    def _grad(self, step: GradStep) -> None:
        if step.create_graph:
            raise Unfit("a grad step with create_graph (a higher-order graph)")
        self._mode(True)
        outputs = [self._node(t) for t in step.outputs]
        inputs = [self._node(t) for t in step.inputs]
        grad_outputs = None if step.grad_outputs is None else [self._value(v, 0) for v in step.grad_outputs]
        grads = self._emit(torch.autograd.grad, (outputs, inputs, grad_outputs),
                           {"retain_graph": step.retain_graph, "allow_unused": step.allow_unused})
        for i, (name, fake) in enumerate(zip(step.out, self.fakes[grads])):
            if fake is not None:  # the runner keeps no id for a None grad: reading it later is the runner's error
                self.nodes[name] = self._emit(operator.getitem, (grads, i), {})

    def _backward(self, step: BackwardStep) -> None:
        if step.create_graph:
            raise Unfit("a backward with create_graph (a higher-order graph)")
        self._mode(True)
        roots = [self._node(t) for t in step.tensors]
        if step.inputs is None:  # the leaves a backward may fill: the inputs that are leaves requiring grad
            targets = [k for k, lay in enumerate(self.layouts) if lay.requires_grad and lay.is_leaf]
        else:
            targets = [self._input(t, "a backward's inputs") for t in step.inputs]
        if not targets:
            raise Unfit("a backward that fills no input")
        grad_tensors = None if step.grad_tensors is None else [self._value(v, 0) for v in step.grad_tensors]
        leaves = [self.nodes[self.template.inputs[k]] for k in targets]
        grads = self._emit(torch.autograd.grad, (roots, leaves, grad_tensors),
                           {"retain_graph": step.retain_graph, "allow_unused": True})
        self._mode(False)  # autograd_steps._accumulate: the adding records nothing
        for i, (k, fake) in enumerate(zip(targets, self.fakes[grads])):
            if fake is None:
                continue
            g = self._emit(operator.getitem, (grads, i), {})
            held = self._grad_of(k)
            if held is None:
                self.grads[k] = self._emit(torch.Tensor.detach, (g,), {})
                self.fresh.add(self.grads[k])
            else:
                self._emit(torch.Tensor.add_, (held, g), {})
                self.mutates = True
        self._mode(True)

    def _set_grad(self, step: SetGradStep) -> None:
        k = self._input(step.id, "a set_grad's target")
        value = self._value(step.grad, 0)
        if value is not None and not isinstance(value, fx.Node):
            raise Unfit("a set_grad to something that is not a tensor")
        self.grads[k] = value

    # -- values ------------------------------------------------------------------------------

    def _value(self, wire: Any, depth: int) -> Any:
        kind = type(wire)
        if kind is dict and len(wire) == 1:
            (tag, payload), = wire.items()
            if tag == "ref":
                return self._node(payload)
            if tag == "grad_of":
                held = self._grad_of(self._input(payload, "a grad read"))
                if held is None:
                    raise Unfit(f"{payload!r} has no grad here (the runner answers it)")
                return held
            if tag == "scalar":
                if payload not in self.scalars:
                    raise Unfit(f"no scalar {payload!r}")
                return self.scalars[payload]
            if tag == "dtype":
                return dtype_from_name(payload, "argument dtype")
            if tag == "slice":
                return slice(*payload)
            if tag == "ellipsis":
                return Ellipsis
            raise Unfit(f"an argument {wire!r}")
        if kind is list:
            if depth == _MAX_DEPTH:
                raise Unfit("an argument nested too deep")
            return [self._value(v, depth + 1) for v in wire]
        return wire

    def _node(self, name: str) -> fx.Node:
        node = self.nodes.get(name)
        if node is None:
            raise Unfit(f"{name!r} is not made before it is read here")
        return node

    def _input(self, name: str, what: str) -> int:
        k = self.inputs.get(name)
        if k is None:
            raise Unfit(f"{what} is not an input of the template ({name!r})")
        return k

    def _check(self, check, args: list, kwargs: dict) -> Check:
        """``check`` of a call, to run on the bound values (and fakes of the computed tensors)."""
        positions = {self.nodes[name]: k for name, k in self.inputs.items()}

        def spec(value: Any) -> Any:
            if isinstance(value, fx.Node):
                return Input(positions[value]) if value in positions else self.fakes[value]
            if isinstance(value, list):
                return [spec(v) for v in value]
            return value

        return Check(check, tuple(spec(a) for a in args), {k: spec(v) for k, v in kwargs.items()})

    def _grad_of(self, k: int):
        """Input ``k``'s grad as the steps so far left it (a node, or None)."""
        state = self.grads.get(k, "start")
        if state != "start":
            return state
        if self.layouts[k].grad is None:
            return None
        if self.layouts[k].grad_bound is not None:  # two arguments of one graph on one tensor
            raise Unfit(f"input {k}'s grad is read or added to, and is bound as input {self.layouts[k].grad_bound}")
        node = self.grad_args.get(k)
        if node is None:
            with self.graph.inserting_after(self._last_placeholder):
                node = self.graph.placeholder(f"grad_{k}")
            self._last_placeholder = node
            self.grad_args[k] = node
            self.fakes[node] = self.mode.from_tensor(_tensor(self.layouts[k].grad, self.device))
            self.grads[k] = node
        return node

    def _plain(self, value: Any) -> Any:
        """``value`` with nodes as their fake tensors (what ``replayable_call`` may look at)."""
        if isinstance(value, fx.Node):
            return self.fakes[value]
        if isinstance(value, list):
            return [self._plain(v) for v in value]
        if isinstance(value, dict):
            return {k: self._plain(v) for k, v in value.items()}
        return value

    # -- nodes -------------------------------------------------------------------------------

    def _mode(self, enabled: bool) -> None:
        if enabled != self.grad_mode:
            self.graph.call_function(torch._C._set_grad_enabled, (enabled,))
            self.grad_mode = enabled

    def _emit(self, fn, args, kwargs) -> fx.Node:
        """A node calling ``fn``, run at once on the fake values (in the graph's grad mode)."""
        node = self.graph.call_function(fn, tuple(args), dict(kwargs))
        with torch.set_grad_enabled(self.grad_mode):
            self.fakes[node] = fn(*self._plain(list(args)), **self._plain(dict(kwargs)))
        return node


def _leaves(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    return [value]

