"""The service's packages are layered, lowest first; each module imports only from its own package or
from packages below it, at the top of its file. An import under ``if TYPE_CHECKING:`` (annotations
only) may point anywhere; an import inside a function is allowed only where listed below, with its reason.

    leaves:    service/__init__.py, settings.py, logs.py, step_histogram.py, gc_freeze.py, openmp_wait.py, process_guards.py
    ops:       service/ops/         the op table (torch's surface, our own entries)
    sessions:  service/sessions/    Session, budgets, the store, CustomTensor: data
    engine:    service/engine/      admission, the runner and its steps, answers
    backends:  service/backends/    where sessions live (in this process, a process per tenant, Ray)
    http:      service/http/        the app, middleware, routes, auth, docs, metrics
    entry:     service/__main__.py
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"
LAYERS = ["leaves", "ops", "sessions", "engine", "backends", "http", "entry"]
LEAVES = {"__init__", "settings", "logs", "step_histogram", "gc_freeze", "openmp_wait", "process_guards"}
# (module, imported module): why it is imported inside a function
LATE_IMPORTS = {
    ("http.app", "backends.ray_sessions"): "ray is an optional extra: imported only when the Ray backend is asked for",
    ("ops", "ops.testing_ops"): "test-only ops register themselves on import, only when Settings.test_ops is on",
    ("__main__", "logs"): "the command line is parsed before the server's modules (and torch) are imported",
    ("__main__", "http.app"): "the command line is parsed before the server's modules (and torch) are imported",
    ("__main__", "http.http_protocol"): "the command line is parsed before the server's modules are imported",
}


def _layer(module: str) -> str:
    first = module.split(".")[0]
    if first == "__main__":
        return "entry"
    if first in LEAVES:
        return "leaves"
    return first


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVICE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _imports(path: Path):
    """(imported service module, at top level, under TYPE_CHECKING) for every import of ours in ``path``."""
    tree = ast.parse(path.read_text())
    package = _module_name(path).split(".") if path.name == "__init__.py" else _module_name(path).split(".")[:-1]
    checking = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)}
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            names = [".".join(base + ([node.module] if node.module else []))]
            if not node.module:  # ``from . import x``: the module x, or a name of the package itself
                names = [".".join(base + [a.name]) if _is_module(base + [a.name]) else ".".join(base) or "__init__"
                         for a in node.names]
        elif (node.module or "").startswith("remote_autograd.service"):
            names = [node.module.removeprefix("remote_autograd.service").lstrip(".")]
        else:
            continue
        for name in names:
            name = name.strip(".")
            if name and (SERVICE / name.replace(".", "/")).with_suffix(".py").exists() or (SERVICE / name.replace(".", "/")).is_dir():
                yield name, id(node) in top, id(node) in checking


def _is_module(parts: list[str]) -> bool:
    path = SERVICE.joinpath(*parts)
    return path.with_suffix(".py").exists() or path.is_dir()


MODULES = sorted(SERVICE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SERVICE)))
def test_each_module_imports_only_its_own_package_or_below(path: Path):
    me = _module_name(path)
    mine = LAYERS.index(_layer(me))
    bad = []
    for name, at_top, under_check in _imports(path):
        if under_check:
            continue
        if LAYERS.index(_layer(name)) > mine:
            bad.append(f"{name} (layer {_layer(name)}, above {_layer(me)})")
        if not at_top and (me, name) not in LATE_IMPORTS:
            bad.append(f"{name} imported inside a function")
    assert not bad, f"service/{path.relative_to(SERVICE)}: {bad}"


def test_the_layers_are_the_folders():
    folders = {p.name for p in SERVICE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"leaves", "entry"}
    loose = {p.stem for p in SERVICE.glob("*.py")} - LEAVES - {"__main__"}
    assert not loose, f"modules at service/'s root outside the leaves: {loose}"


def test_every_late_import_is_still_there():
    found = {(_module_name(p), name) for p in MODULES for name, at_top, _ in _imports(p) if not at_top}
    assert set(LATE_IMPORTS) <= found, set(LATE_IMPORTS) - found


def test_no_module_imports_itself_round_a_circle():
    """Imports form no circle, inside a package too (a circle works only by import order); a late import
    counts too (``ops`` loads ``ops.testing_ops`` late: the test-only ops import what they need from
    ``ops._registry``, not from the package that loads them)."""
    graph = {_module_name(p): {n for n, _, checking in _imports(p) if not checking} for p in MODULES}
    done, path = set(), []

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError(" -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for name in graph.get(module, ()):
            visit(name)
        path.pop()
        done.add(module)

    for module in graph:
        visit(module)


def test_the_runtime_never_imports_the_op_generator_or_torchs_test_databases():
    """``surface.json``'s generator (``tools/derive_ops``) runs torch's test databases
    (``torch.testing._internal``): a developer's tool, outside the installed package, which the server
    never imports; the server reads the committed file alone."""
    for path in MODULES:
        tree = ast.parse(path.read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.split(".")[0] == "tools" or m.startswith("torch.testing")], path
    assert not list((SERVICE / "ops").glob("*derive*")), "the generator lives in tools/derive_ops"
