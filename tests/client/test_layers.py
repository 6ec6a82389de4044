"""The client package's import direction: every room imports only from rooms below its own.

A room is one of the SDK's subpackages (``client/transport/``, ``client/dispatch/``, ...) or a
module at the package's top (``client/_session.py``). The layer list of rooms is read from
``client/__init__.py``'s docstring (the one place it is written), and every ``client/**/*.py`` is
parsed with ``ast``: an import of another client module must sit at the top of the file (not in a
function, not at the bottom after the code that needs it) and point to a lower room. Inside one
room the modules may import each other, but never in a circle. A circle between rooms needs at
least one import that points up or sideways, so a new circle fails here. ``if TYPE_CHECKING:``
imports count as any other: an annotation that needs a module above is a circle hidden, not gone.

The core (``client/_core.py``) calls what lives above it only through tables it defines, which the
modules above fill as they are imported; nothing is wired from outside: no ``wire()`` function, no
module-level placeholder a function rebinds with ``global``, no statement in ``client/__init__``
besides imports and its own definitions.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from remote_autograd import client
from remote_autograd.client import _core
from remote_autograd.client.dispatch import _meta_memo, _user_functions
from remote_autograd.client.handlers import HANDLER_MODULES, _kernels
from remote_autograd.client.handlers._handler_table import HandlerTable, merge
from remote_autograd.client.session import _callsite

CLIENT = Path(client.__file__).parent
PACKAGE = "remote_autograd.client"

# Imports inside functions that stay there, each for its reason (anything else is at the top).
IN_FUNCTION_ALLOWED = {
    ("transport._embedded", "remote_autograd.service"):
        "the embedded server: the SDK's one meeting point with the service",
    ("transport._progress", "tqdm"): "an optional dependency, loaded only when a bar is shown",
    ("tensor._traced", "torch._dynamo"): "loaded while torch.compile runs (dynamo takes seconds to import)",
}


def declared_layers() -> dict[str, int]:
    """room name -> its layer's position (0 lowest), from client/__init__'s docstring."""
    doc = ast.get_docstring(ast.parse((CLIENT / "__init__.py").read_text()))
    lines = doc.split("The package's rooms are layered", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"    \S[^:]*:\s", line))
    layers: list[list[str]] = []
    for line in lines[start:]:
        if not line.strip():
            break
        named = re.match(r"    \S[^:]*:(.*)", line)
        if named:  # a new layer; an indented line without a name continues the one above
            layers.append([])
        layers[-1].extend((named.group(1) if named else line).split())
    return {room.rstrip("/"): depth for depth, rooms in enumerate(layers) for room in rooms}


def rooms() -> list[str]:
    """The rooms on disk: each subpackage, and each module at the top (``__init__`` among them)."""
    return sorted([p.stem for p in CLIENT.glob("*.py")] + [p.parent.name for p in CLIENT.glob("*/__init__.py")])


def modules() -> list[str]:
    """Every client module, as its dotted name below the package: ``transport._http``, ``_session``."""
    return sorted(".".join(p.relative_to(CLIENT).with_suffix("").parts) for p in CLIENT.rglob("*.py"))


def room_of(module: str) -> str:
    """``transport`` for ``transport._http``, ``transport`` for ``transport.__init__``, ``_session`` for itself."""
    return module.split(".")[0]


def imports_of(path: Path, module: str) -> list[tuple[str, int, bool, bool]]:
    """(imported module, line, at the top of the file, under ``if TYPE_CHECKING:``) for each import.
    At the top: at module level, before the first function or class (not at the bottom of the file)."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, int, bool, bool]] = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    first_def = min((n.lineno for n in tree.body if isinstance(n, defs)), default=float("inf"))

    def visit(node: ast.AST, top: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                at_top = top and child.lineno < first_def
                found.extend((alias.name, child.lineno, at_top, type_checking) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                at_top = top and child.lineno < first_def
                found.extend((name, child.lineno, at_top, type_checking) for name in _from_targets(child, module))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                visit(child, False, type_checking)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                visit(child, top, True)
            else:
                visit(child, top, type_checking)

    visit(tree, True, False)
    return found


def _from_targets(node: ast.ImportFrom, module: str) -> list[str]:
    """The modules a ``from`` import reaches, absolute: in ``transport/_http.py``, ``from . import _x``
    -> remote_autograd.client.transport._x and ``from .._session import S`` -> remote_autograd.client._session."""
    if node.level == 0:
        base = node.module or ""
    else:
        parts = [PACKAGE, *module.split(".")[:-1]]  # the package the file is in (``__init__`` is in its own)
        if node.level > 1:
            parts = parts[:-(node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    if base.startswith(PACKAGE):  # `from . import _a` or `from remote_autograd.client import _a, connect`
        folder = CLIENT.joinpath(*base.split(".")[2:])
        return [f"{base}.{alias.name}" if (folder / f"{alias.name}.py").exists()
                or (folder / alias.name / "__init__.py").exists() else base for alias in node.names]
    return [base]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def client_module(name: str) -> str | None:
    """``transport._http`` for remote_autograd.client.transport._http (or its members), ``__init__`` for the
    package itself, ``transport.__init__`` for a subpackage; None outside the client package."""
    if name == PACKAGE:
        return "__init__"
    if not name.startswith(PACKAGE + "."):
        return None
    parts = name[len(PACKAGE) + 1:].split(".")
    if (CLIENT / parts[0] / "__init__.py").exists():
        return f"{parts[0]}.{parts[1]}" if len(parts) > 1 and (CLIENT / parts[0] / f"{parts[1]}.py").exists() \
            else f"{parts[0]}.__init__"
    return parts[0]


def layer_violations(layers: dict[str, int], module: str, imports: list[tuple[str, int, bool, bool]]) -> list[str]:
    """What is wrong with one module's imports, as lines a reader can act on (empty: nothing)."""
    problems = []
    room = room_of(module)
    for name, line, top, type_checking in imports:
        target = client_module(name)
        where = f"client/{module.replace('.', '/')}.py:{line}"
        if not top:
            reason = next((why for (m, prefix), why in IN_FUNCTION_ALLOWED.items()
                           if m == module and (name == prefix or name.startswith(prefix + "."))), None)
            if reason is None:
                problems.append(f"{where}: `{name}` imported inside a function or class, or below one; "
                                "import it at the top")
            continue
        if target is None:
            continue
        target_room = room_of(target)
        if target_room == room:
            continue  # inside one room: checked for circles below
        if target_room not in layers:
            problems.append(f"{where}: imports client/{target_room}, which has no layer in client/__init__'s list")
        elif layers[target_room] >= layers[room]:
            problems.append(f"{where}: imports {target_room} (layer {layers[target_room]}) from {room} "
                            f"(layer {layers[room]}): imports point down only")
    return problems


def circles_inside_rooms(imports: dict[str, list[tuple[str, int, bool, bool]]]) -> list[list[str]]:
    """Circles among the modules of one room (top-level imports, ``TYPE_CHECKING`` ones too, within the room)."""
    graph = {m: {client_module(n) for n, _, top, _tc in found if top} for m, found in imports.items()}
    graph = {m: {t for t in targets if t and t != m and room_of(t) == room_of(m) and not t.endswith("__init__")}
             for m, targets in graph.items()}
    circles, done = [], set()

    def walk(m: str, path: list[str]) -> None:
        for t in sorted(graph.get(m, ())):
            if t in path:
                circles.append(path[path.index(t):] + [t])
            elif t not in done:
                walk(t, path + [t])
        done.add(m)

    for m in sorted(graph):
        if m not in done:
            walk(m, [m])
    return circles


def slots(path: Path, module: str) -> list[str]:
    """What wires a module from outside, as lines a reader can act on: a function named ``wire``; a module-level
    name bound to one of the module's functions (a placeholder) that a function rebinds with ``global``; in the
    package's ``__init__``, any module-level statement but imports, definitions and ``__all__``."""
    tree = ast.parse(path.read_text())
    where = f"client/{module.replace('.', '/')}.py"
    found = [f"{where}:{n.lineno}: a `wire` function" for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "wire"]
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    placeholders = {}
    for n in tree.body:
        target, value = ((n.targets[0], n.value) if isinstance(n, ast.Assign) and len(n.targets) == 1
                         else (n.target, n.value) if isinstance(n, ast.AnnAssign) else (None, None))
        if isinstance(target, ast.Name) and isinstance(value, ast.Name) and value.id in functions:
            placeholders[target.id] = n.lineno
    found += [f"{where}:{n.lineno}: `global {name}` rebinds a placeholder (line {placeholders[name]}): a slot"
              for n in ast.walk(tree) if isinstance(n, ast.Global) for name in n.names if name in placeholders]
    if module == "__init__":
        allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
        for n in tree.body:
            docstring = isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and n is tree.body[0]
            all_list = isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]
            if not (isinstance(n, allowed) or docstring or all_list):
                found.append(f"{where}:{n.lineno}: a statement in the package's __init__ (it only imports)")
    return found


def _all_imports() -> dict[str, list[tuple[str, int, bool, bool]]]:
    return {m: imports_of(CLIENT.joinpath(*m.split(".")).with_suffix(".py"), m) for m in modules()}


def test_every_room_has_a_layer_and_imports_only_downward():
    layers = declared_layers()
    assert sorted(layers) == rooms(), "each client subpackage and top module is named once in client/__init__'s list"
    imports = _all_imports()
    problems = [p for m, found in imports.items() for p in layer_violations(layers, m, found)]
    assert not problems, "\n".join(problems)
    assert not circles_inside_rooms(imports)


def test_nothing_is_wired_from_outside():
    problems = [p for m in modules() for p in slots(CLIENT.joinpath(*m.split(".")).with_suffix(".py"), m)]
    assert not problems, "\n".join(problems)


def test_the_slot_check_catches_a_wire_function_a_global_placeholder_and_wiring_in_init(tmp_path):
    slot = tmp_path / "_tensor.py"
    slot.write_text("def _not_wired(*a):\n    raise RuntimeError\n\n_call_op = _not_wired\n\n"
                    "def wire(*, call_op):\n    global _call_op\n    _call_op = call_op\n")
    problems = slots(slot, "tensor._tensor")
    assert len(problems) == 2 and "a `wire` function" in problems[0] and "`global _call_op`" in problems[1], problems
    init = tmp_path / "__init__.py"
    init.write_text('"""doc"""\nfrom . import _core, handlers\n__all__ = ["x"]\n'
                    "_core.wire(handlers=handlers.LOCAL_HANDLERS)\n_core.ATTACH.append(print)\n")
    assert [p.split(": ", 1)[1] for p in slots(init, "__init__")] == [
        "a statement in the package's __init__ (it only imports)"] * 2


def test_the_checker_catches_upward_sideways_late_in_function_and_circular_imports(tmp_path):
    # The check above passes on the tree as it is; here it must fail on each kind of wrong import.
    layers = declared_layers()
    wrong = tmp_path / "_views.py"
    wrong.write_text("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                     "from ..dispatch._outputs import infer\n"  # up: tensor is below dispatch
                     "if TYPE_CHECKING:\n    from .._session import Session\n"  # up too: not exempt
                     "def f():\n    from ..dispatch import _outputs\n"  # in a function
                     "from remote_autograd.client.session import _routes\n")  # down, but at the bottom
    problems = layer_violations(layers, "tensor._views", imports_of(wrong, "tensor._views"))
    assert len(problems) == 4, problems
    assert f"imports dispatch (layer {layers['dispatch']}) from tensor (layer {layers['tensor']})" in problems[0]
    assert f"imports _session (layer {layers['_session']}) from tensor (layer {layers['tensor']})" in problems[1]
    assert "`remote_autograd.client.dispatch._outputs` imported inside a function" in problems[2]
    assert "`remote_autograd.client.session._routes` imported inside a function or class, or below one" in problems[3]
    sideways = tmp_path / "_moves.py"
    sideways.write_text("from .._session import Session\nfrom remote_autograd.client import _session, connect\n")
    assert [p.split(": ", 1)[1] for p in layer_violations(layers, "handlers._moves",
                                                          imports_of(sideways, "handlers._moves"))] == [
        f"imports _session (layer {layers['_session']}) from handlers (layer {layers['handlers']}): "
        "imports point down only",
        f"imports _session (layer {layers['_session']}) from handlers (layer {layers['handlers']}): "
        "imports point down only",
        f"imports __init__ (layer {layers['__init__']}) from handlers (layer {layers['handlers']}): "
        "imports point down only"]
    # two modules of one room importing each other at the top: a circle
    assert circles_inside_rooms({"tensor._views": [("remote_autograd.client.tensor._traced", 1, True, False)],
                                 "tensor._traced": [("remote_autograd.client.tensor._views", 1, True, False)]})
    # ... and when one of the two is an annotation's import (under TYPE_CHECKING)
    assert circles_inside_rooms({"tensor._views": [("remote_autograd.client.tensor._traced", 1, True, False)],
                                 "tensor._traced": [("remote_autograd.client.tensor._views", 1, True, True)]})


def test_the_modules_above_the_core_registered_into_its_tables_as_they_were_imported():
    tables = [m.HANDLERS for m in HANDLER_MODULES]
    assert all(tables), "every handler module answers something"
    assert _core.LOCAL_HANDLERS == merge(*tables)
    assert _core.INFERENCE == {"outputs": _meta_memo.answer}
    assert _callsite.ATTACH == [_user_functions.attach] and _callsite.BEFORE_FORWARD == [_user_functions.before_forward]
    assert _kernels._LIB is not None and _kernels.KERNELS


def test_a_callable_claimed_by_two_handler_tables_is_refused():
    first, second = HandlerTable(), HandlerTable()
    first.on(len)(lambda t: 1)
    second.on(len, abs)(lambda t: 2)
    with pytest.raises(RuntimeError, match="two handlers"):
        merge(first, second)

