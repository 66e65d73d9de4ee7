"""service/ is laid out as the processes are (issue 26), and its import graph says so: no module-level
import cycle, and each layer imports only what it may.

- shared (settings, errors, memory, metrics, metrics_http, metrics_multiprocess, thread_names at the top of
  service/): no layer;
- engine/: shared only;
- core/: engine and shared;
- grpc/, http/: core and shared, never each other or kserve/;
- kserve/: core, shared, and the transport helpers of grpc/ and http/;
- a front (grpc/, http/, kserve/) names engine modules only from ENGINE_TYPES_OF_FRONTS;
- supervisor/: anything.

The graph is read with `ast` (nothing is imported): every `import`/`from ... import` of a bertserve.service
module, at module level or inside a function; imports under `if TYPE_CHECKING:` count for the layers but
not for cycles (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[1] / "service"
PACKAGE = "bertserve.service"
SHARED = {
    "settings",
    "errors",
    "memory",
    "metrics",
    "metrics_http",
    "metrics_multiprocess",
    "native_build",
    "thread_names",
}
LAYERS = {"engine", "core", "grpc", "http", "kserve", "supervisor"}
# layer -> the layers it may import (besides itself and the shared modules)
MAY_IMPORT = {
    "shared": set(),
    "engine": set(),
    "core": {"engine"},
    "grpc": {"core"},
    "http": {"core"},
    "kserve": {"core", "grpc", "http"},
    "supervisor": LAYERS,
}
# The engine types the fronts name, and why: the vocabulary of a call (tasks), the tokenized input the
# replies carry (tokenization), the served model the KServe routes describe, and the deadline slack the
# batcher grants (one constant, shared so a front and the engine agree on "too late").
FRONTS = {"grpc", "http", "kserve"}
ENGINE_TYPES_OF_FRONTS = {
    "bertserve.service.engine.tasks",
    "bertserve.service.engine.tokenization",
    "bertserve.service.engine.served_model",
    "bertserve.service.engine.batcher",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVICE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def layer_of(module: str) -> str:
    parts = module.removeprefix(PACKAGE).lstrip(".").split(".")
    if parts[0] in LAYERS:
        return parts[0]
    if parts[0] in SHARED or parts == [""]:
        return "shared"
    raise AssertionError(f"{module}: neither a shared module nor in one of {sorted(LAYERS)}")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, bool]]:
    """(imported service module, runs at import time or in a function: not TYPE_CHECKING-only)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def target(module: str) -> str | None:
        while module and module not in modules:  # `from a.b import c` where a.b is a module's attribute
            module = module.rpartition(".")[0]
        return module or None

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + ".") and (t := target(alias.name)):
                    found.append((t, runs))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source == PACKAGE or source.startswith(PACKAGE + "."):
                for alias in node.names:
                    t = target(f"{source}.{alias.name}")
                    if t and t != PACKAGE:
                        found.append((t, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def graph() -> dict[str, list[tuple[str, bool]]]:
    paths = {module_name(p): p for p in SERVICE.rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules) for name, path in sorted(paths.items())}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or one that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_every_module_is_in_a_layer():
    for name in graph():
        layer_of(name)


def test_no_import_cycle():
    # a package's __init__ is imported before its modules: a module importing its own package is no cycle
    edges = {
        name: {t for t, runs in deps if runs and not name.startswith(t + ".")}
        for name, deps in graph().items()
    }
    assert cycles(edges) == []


def test_layers():
    violations = []
    for name, deps in graph().items():
        mine = layer_of(name)
        for imported, _ in deps:
            theirs = layer_of(imported)
            if theirs in ("shared", mine) or theirs in MAY_IMPORT[mine]:
                continue
            if mine in FRONTS and theirs == "engine" and imported in ENGINE_TYPES_OF_FRONTS:
                continue
            violations.append(f"{name} ({mine}) imports {imported} ({theirs})")
    assert violations == []


def test_the_checks_see_violations():
    """The graph reader finds what the tests above would refuse (so they cannot pass by reading nothing)."""
    edges = graph()
    assert ("bertserve.service.engine.batcher", True) in edges["bertserve.service.engine.encoders"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert len(edges) > 60
