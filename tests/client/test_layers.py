"""The client package's import direction: every module imports only from layers below its own.

The layer list is read from ``client/__init__.py``'s docstring (the one place it is written),
and every ``client/*.py`` is parsed with ``ast``: an import of another client module must sit
at the top of the file (not in a function, not at the bottom after the code that needs it)
and point to a lower layer. A circle needs at least one import that points up or sideways,
so a new circle fails here. ``if TYPE_CHECKING:`` imports never run and are exempt.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from remote_autograd.client import (_autograd, _composites, _copies, _dispatch, _kernels, _local, _moves, _packed,
                                    _tensor)
from remote_autograd.client._handler_table import HandlerTable, merge

CLIENT = Path(_tensor.__file__).parent
PACKAGE = "remote_autograd.client"

# Imports inside functions that stay there, each for its reason (anything else is at the top).
IN_FUNCTION_ALLOWED = {
    ("_embedded", "remote_autograd.service"): "the embedded server: the SDK's one meeting point with the service",
    ("_progress", "tqdm"): "an optional dependency, loaded only when a bar is shown",
}


def declared_layers() -> dict[str, int]:
    """module name -> its layer's position (0 lowest), from client/__init__'s docstring."""
    doc = ast.get_docstring(ast.parse((CLIENT / "__init__.py").read_text()))
    lines = doc.split("The package's modules are layered", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"    \S[^:]*:\s", line))
    layers: list[list[str]] = []
    for line in lines[start:]:
        if not line.strip():
            break
        named = re.match(r"    \S[^:]*:(.*)", line)
        if named:  # a new layer; an indented line without a name continues the one above
            layers.append([])
        layers[-1].extend((named.group(1) if named else line).split())
    return {module: depth for depth, modules in enumerate(layers) for module in modules}


def imports_of(path: Path) -> list[tuple[str, int, bool, bool]]:
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
                found.extend((name, child.lineno, at_top, type_checking) for name in _from_targets(child))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                visit(child, False, type_checking)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                visit(child, top, True)
            else:
                visit(child, top, type_checking)

    visit(tree, True, False)
    return found


def _from_targets(node: ast.ImportFrom) -> list[str]:
    """The modules a ``from`` import reaches, absolute: ``from . import _x`` -> remote_autograd.client._x."""
    if node.level == 0:
        base = node.module or ""
    elif node.level == 1:
        base = PACKAGE + (f".{node.module}" if node.module else "")
    else:
        base = "remote_autograd" + (f".{node.module}" if node.module else "")
    if base == PACKAGE:  # `from . import _a` or `from remote_autograd.client import _a, connect`
        return [f"{base}.{alias.name}" if (CLIENT / f"{alias.name}.py").exists() else base for alias in node.names]
    return [base]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def client_module(name: str) -> str | None:
    """``_tensor`` for remote_autograd.client._tensor (or its members); None outside the client package."""
    if name == PACKAGE:
        return "__init__"
    if name.startswith(PACKAGE + "."):
        return name[len(PACKAGE) + 1:].split(".")[0]
    return None


def layer_violations(layers: dict[str, int], module: str, imports: list[tuple[str, int, bool, bool]]) -> list[str]:
    """What is wrong with one module's imports, as lines a reader can act on (empty: nothing)."""
    problems = []
    for name, line, top, type_checking in imports:
        target = client_module(name)
        where = f"client/{module}.py:{line}"
        if not top:
            reason = next((why for (m, prefix), why in IN_FUNCTION_ALLOWED.items()
                           if m == module and (name == prefix or name.startswith(prefix + "."))), None)
            if reason is None:
                problems.append(f"{where}: `{name}` imported inside a function or class, or below one; "
                                "import it at the top")
            continue
        if target is None or type_checking or target == module:
            continue
        if target not in layers:
            problems.append(f"{where}: imports client/{target}.py, which has no layer in client/__init__'s list")
        elif layers[target] >= layers[module]:
            problems.append(f"{where}: imports {target} (layer {layers[target]}) from layer {layers[module]}: "
                            "imports point down only")
    return problems


def test_every_client_module_has_a_layer_and_imports_only_downward():
    layers = declared_layers()
    modules = sorted(p.stem for p in CLIENT.glob("*.py"))
    assert sorted(layers) == modules, "each client/*.py is named once in client/__init__'s layer list"
    problems = [p for m in modules for p in layer_violations(layers, m, imports_of(CLIENT / f"{m}.py"))]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_upward_sideways_late_and_in_function_imports(tmp_path):
    # The check above passes on the tree as it is; here it must fail on each kind of wrong import.
    layers = declared_layers()
    wrong = tmp_path / "_views.py"
    wrong.write_text("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                     "from ._tensor import RemoteTensor\n"  # up: _views is a leaf
                     "if TYPE_CHECKING:\n    from ._session import Session\n"  # exempt
                     "def f():\n    from . import _dispatch\n"  # in a function
                     "from remote_autograd.client.session import _routes\n")  # down, but at the bottom
    problems = layer_violations(layers, "_views", imports_of(wrong))
    assert len(problems) == 3, problems
    assert f"imports _tensor (layer {layers['_tensor']}) from layer 0" in problems[0]
    assert "`remote_autograd.client._dispatch` imported inside a function" in problems[1]
    assert "`remote_autograd.client.session._routes` imported inside a function or class, or below one" in problems[2]
    sideways = tmp_path / "_moves.py"
    sideways.write_text("from . import _local\nfrom remote_autograd.client import _tensor, connect\n")
    assert [p.split(": ", 1)[1] for p in layer_violations(layers, "_moves", imports_of(sideways))] == [
        f"imports _local (layer {layers['_local']}) from layer {layers['_moves']}: imports point down only",
        f"imports __init__ (layer {layers['__init__']}) from layer {layers['_moves']}: imports point down only"]


def test_the_wiring_filled_the_tensors_slots_from_every_handler_table():
    tables = (_local.HANDLERS, _autograd.HANDLERS, _moves.HANDLERS, _packed.HANDLERS, _composites.HANDLERS,
              _copies.HANDLERS)
    assert all(tables), "every handler module answers something"
    assert _tensor.LOCAL_HANDLERS == merge(*tables)
    assert _tensor._apply_route is _dispatch.apply_route
    assert _kernels._LIB is not None and _kernels.KERNELS


def test_a_callable_claimed_by_two_handler_tables_is_refused():
    first, second = HandlerTable(), HandlerTable()
    first.on(len)(lambda t: 1)
    second.on(len, abs)(lambda t: 2)
    with pytest.raises(RuntimeError, match="two handlers"):
        merge(first, second)
