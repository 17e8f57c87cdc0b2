"""The package's layout: modules small enough to read, and imports that run one way only."""

from __future__ import annotations

import ast
import os

import batchtool

PACKAGE = os.path.dirname(os.path.abspath(batchtool.__file__))
MAX_LINES = 600


def _modules() -> dict[str, str]:
    """Every module of the package by its dotted name, with its path."""
    found = {}
    for folder, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules `name` imports, also inside functions (they run too), but not under TYPE_CHECKING;
    with the packages that hold them (importing formats.column_types runs formats/__init__.py first), but for
    those `name` is inside."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    typing_only = {id(node) for branch in ast.walk(tree)
                   if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
                   for node in ast.walk(branch)}
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    targets = {t for t in targets if t in modules}
    packages = {parent for t in targets for parent in _parents(t) if not name.startswith(parent + ".")}
    return (targets | packages) - {name}


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def test_no_module_is_longer_than_600_lines() -> None:
    long = {name: n for name, path in _modules().items()
            if (n := sum(1 for _ in open(path, encoding="utf-8"))) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along a seam): {long}"


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import cycle in the package, so every module can be imported first, alone, and the layers read one way."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[name] = 2

    for root in sorted(graph):
        if root not in state:
            visit(root, [root])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
