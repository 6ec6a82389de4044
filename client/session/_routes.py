"""Which op of the server's table a torch callable becomes, and how its arguments are arranged.

The table comes from ``GET /v1/ops``: each entry lists the torch names routed to
it (as ``torch.overrides.resolve_name`` spells them). An entry that is torch's own op
(``spelled``) is called by the spelling itself, without ``torch.`` (``Tensor.add_``,
``Tensor.__rsub__``, ``nn.functional.relu``): the server runs exactly that callable, with
the arguments as the user gave them. For our own entries a name of the form
``Tensor.__rX__`` swaps its first two arguments, and ``Tensor.X_``, ``torch.X_`` and
``Tensor.__iX__`` are the in-place forms of ``X`` (``proto/op_contract.is_inplace_name``).
An op called by its name (factories, session ops, ``sess.ops.X``) has a route too (``named``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import resolve_name

from remote_autograd.proto.op_contract import is_inplace_name

_REFLECTED = {"__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rdiv__", "__rpow__", "__rmatmul__",
              "__rfloordiv__", "__rmod__", "__rand__", "__ror__", "__rxor__"}


@dataclass(frozen=True)
class OpSpec:
    """What the client knows of one server op."""

    name: str
    shape_rule: str
    differentiable: bool
    inplace: bool = False  # the op only exists in place (zero_, __setitem__)
    no_grad_args: frozenset = frozenset()  # arg positions/names whose tensors never get a gradient
    # the entry's facts the SDK acts on (proto/SPEC.md §2): positions of tensor arguments torch takes from
    # the CPU; a view or a copy by its input's strides (reshape); in place, it changes its target's layout (t_)
    cpu_args: tuple[int, ...] = ()
    maybe_view: bool = False
    relayout: bool = False


@dataclass(frozen=True)
class Route:
    """A torch callable mapped to a server op: the wire name and how to arrange arguments."""

    op: OpSpec
    wire_name: str
    reflected: bool
    inplace: bool
    torch_name: str
    by_name: bool = False  # called by the server's op name: no torch callable to run on meta


class RouteTable:
    """torch callable -> Route, built once per server from its op list; lookups are cached."""

    def __init__(self, ops: list[dict[str, Any]]) -> None:
        self.ops: dict[str, OpSpec] = {}
        self._by_name: dict[str, Route] = {}
        spelled: dict[str, OpSpec] = {}  # call-step names of torch's own ops' spellings (``fill_``, ``Tensor.view``)
        for info in ops:
            spec = OpSpec(info["name"], info["shape_rule"], info["differentiable"], info.get("inplace", False),
                          frozenset(info.get("no_grad_args", ())), tuple(info.get("cpu_args", ())),
                          info.get("maybe_view", False), info.get("relayout", False))
            self.ops[spec.name] = spec
            for tname in info["torch_names"]:
                if info.get("spelled"):
                    route = self._by_name[tname] = _spelled_route(spec, tname)
                    spelled[route.wire_name] = spec
                    spelled.setdefault(route.wire_name.removeprefix("Tensor."), spec)
                else:
                    self._by_name[tname] = _route_for(spec, tname)
        for wire, spec in spelled.items():  # sess.ops.fill_, the SDK's factories' fills: by the server's names
            self.ops.setdefault(wire, spec)
        self.by_func: dict[Callable, Route | None] = {}  # lookup's answers (__torch_function__ reads it first)
        self._named: dict[str, Route] = {}

    def named(self, name: str) -> Route:
        """The route of the op the server's table calls ``name``; NotImplementedError when it has none."""
        route = self._named.get(name)
        if route is None:
            spec = self.ops.get(name)
            if spec is None:
                if name != "manual_seed":  # older servers list no session ops
                    raise NotImplementedError(f"the server's op table has no op {name!r} (GET /v1/ops lists the table)")
                spec = OpSpec(name, "none", False)
            route = self._named[name] = Route(spec, name, False, spec.inplace or is_inplace_name(name), name, True)
        return route

    def lookup(self, func: Callable) -> Route | None:
        try:
            return self.by_func[func]
        except KeyError:
            pass
        except TypeError:  # unhashable callables: never cached
            return self._by_name.get(_name_of(func))
        route = self._by_name.get(_name_of(func))
        self.by_func[func] = route
        return route


def _name_of(func: Callable) -> str:
    """``resolve_name``'s spelling; for torch's builtins it cannot name (``torch._foreach_add_``), the
    ``torch.<name>`` they are reachable as."""
    name = resolve_name(func)
    if name:
        return name
    short = getattr(func, "__name__", None)
    return f"torch.{short}" if short and getattr(torch, short, None) is func else ""


def _route_for(spec: OpSpec, tname: str) -> Route:
    short = tname.rsplit(".", 1)[-1]
    reflected = short in _REFLECTED
    inplace = spec.inplace or is_inplace_name(short)
    wire = spec.name + "_" if inplace and not (spec.inplace or spec.name.endswith("_")) else spec.name
    return Route(spec, wire, reflected, inplace, tname)


def _spelled_route(spec: OpSpec, tname: str) -> Route:
    """A spelling of torch's own op: called by its own name, arguments as given."""
    short = tname.rsplit(".", 1)[-1]
    inplace = spec.inplace or is_inplace_name(short) or short == "__setitem__"
    return Route(spec, tname.removeprefix("torch."), False, inplace, tname)


def torch_name(func: Callable) -> str:
    """A readable name for any torch callable, for error messages."""
    try:
        return _name_of(func) or getattr(func, "__qualname__", repr(func))
    except Exception:
        return repr(func)


_ROUTE_TABLES: dict[str, RouteTable] = {}


def route_table(transport: Any) -> RouteTable:
    """The server's op table of ``transport`` (a ``Transport``), fetched once per URL over sockets. A given
    transport's is not cached: two in-process apps may share a placeholder URL and not their ops."""
    if not transport.own_socket_layer:
        return RouteTable(transport.call("GET", "/v1/ops")["ops"])
    table = _ROUTE_TABLES.get(transport.base_url)
    if table is None:
        table = _ROUTE_TABLES[transport.base_url] = RouteTable(transport.call("GET", "/v1/ops")["ops"])
    return table
