"""The package's layout: modules small enough to read, folders that are layers, and imports that run one way only.

The layers, lowest first: each folder imports only from the folders below it (and, inside itself, with no cycle);
imports under `if TYPE_CHECKING:` count too, so a type used across layers lives in the lower one."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys

import batchtool

PACKAGE = os.path.dirname(os.path.abspath(batchtool.__file__))
MAX_LINES = 600
LAYERS = ("core", "io", "ops", "exec", "pipeline", "loader", "check", "cli")
"""batchtool's folders, lowest first."""
TOP = ("entry", "__main__")
"""The modules directly in batchtool/ besides __init__.py: above every layer (the package itself is above them)."""
MAX_TOP_MODULES = 6


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
    """The package's modules `name` imports, also inside functions (they run too) and under TYPE_CHECKING (a type
    checker reads them, and a type used across layers belongs to the lower one); with the packages that hold them
    (importing io.formats.base runs io/formats/__init__.py first), but for those `name` is inside."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
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


def _rank(name: str) -> int:
    """The layer of module `name`: its folder's place in LAYERS; the top modules above them all, the package last."""
    parts = name.split(".")
    if len(parts) == 1:
        return len(LAYERS) + 1
    if parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    assert parts[1] in TOP, f"{name} is neither in a layer's folder nor one of the top modules {TOP}"
    return len(LAYERS)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    """An import goes down the layers or stays in its folder, never up: core/ reads nothing of the package above it,
    the ops never reach into the driver, the loader never into the CLI."""
    upward = sorted(f"{name} -> {target}" for name, targets in _graph().items() for target in targets
                    if _rank(target) > _rank(name))
    assert not upward, f"imports that go up the layers {LAYERS}:\n" + "\n".join(upward)


def _names_dataset(node: ast.AST) -> bool:
    """Whether `node` imports or names io.dataset's Dataset (`from batchtool.io.dataset import Dataset`, a star
    import of it, `dataset.Dataset`)."""
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "dataset":
        return any(alias.name in ("Dataset", "*") for alias in node.names)
    return isinstance(node, ast.Attribute) and node.attr == "Dataset"


def test_the_ops_get_rows_not_the_dataset() -> None:
    """No op reads its input itself: a regrouping op is told what is known of its input (ops.regroup.Input) and the
    driver feeds it its rows (the probe, Runtime.rows, Runtime.map_rows), so no module under ops/ imports or names
    Dataset (Chunk, the rows it is fed, and ReadReport, where the reading's skips go, stay)."""
    found = sorted(f"{name}:{node.lineno}" for name, path in _modules().items() if name.startswith("batchtool.ops.")
                   for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())) if _names_dataset(node))
    assert not found, "ops that take the Dataset instead of the rows the driver feeds them:\n" + "\n".join(found)


def test_only_a_few_modules_sit_directly_in_the_package() -> None:
    top = sorted(name for name in os.listdir(PACKAGE)
                 if name.endswith(".py") and name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_MODULES, f"modules directly in batchtool/ (put them in a layer's folder): {top}"
    assert {name[:-3] for name in top} <= set(TOP), f"top modules not named in TOP: {top}"
    folders = sorted(name for name in os.listdir(PACKAGE)
                     if os.path.isfile(os.path.join(PACKAGE, name, "__init__.py")))
    assert folders == sorted(LAYERS), f"batchtool's packages are its layers {LAYERS}: {folders}"


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import cycle in the package, even inside a folder and counting TYPE_CHECKING imports, so every module can be
    imported first, alone, and the layers read one way."""
    graph = _graph()
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


def test_the_public_api_is_what_the_package_exports_and_imports_nothing_heavy() -> None:
    """`import batchtool` loads no pyarrow (the command sets its signal handlers first), and every public name
    resolves to the function or class it names, also after its module was imported (no submodule shadows it)."""
    code = ("import sys, batchtool\n"
            "assert 'pyarrow' not in sys.modules, 'import batchtool loaded pyarrow'\n"
            "import batchtool.loader.load, batchtool.loader.source, batchtool.exec.convert\n"
            "for name in batchtool.__all__:\n"
            "    value = getattr(batchtool, name)\n"
            "    assert not isinstance(value, type(sys)), (name, value)\n"
            "print(*(getattr(batchtool, name).__module__ for name in ('load', 'source')), batchtool.run.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["batchtool.loader.load", "batchtool.loader.source", "run_operation"]


_DOTTED = re.compile(r"(?<![\w./-])([a-z_]\w*(?:[./][A-Za-z_]\w*)+)")
INTERNALS = os.path.join(os.path.dirname(PACKAGE), "docs", "internals.md")


def _names(text: str, modules: dict[str, str]) -> set[str]:
    """The dotted names and .py paths in `text` that name the package's code: `batchtool.x.y`, a name that starts
    with one of its packages (`ops.base.Operation`, `formats.column_types`), a module's class or constant
    (`spill.Cells`, `rng.SHARD_BITS`, private ones too: `output._Name`; not `output.padding`, which reads as a
    manifest key or an attribute), and file paths (`ops/rows.py`, `plan.py`)."""
    packages = {name.rpartition(".")[2] for name, path in modules.items() if path.endswith("__init__.py")}
    leaves = {name.rpartition(".")[2] for name in modules}
    found = set()
    for name in _DOTTED.findall(text):
        name = name.rstrip(".")
        parts = name.replace("/", ".").split(".")
        if name.endswith(".py") or parts[0] in ("batchtool", *packages) or (
                parts[0] in leaves and parts[1].lstrip("_")[:1].isupper()):
            found.add(name)
    return found


def _resolves(name: str, modules: dict[str, str]) -> bool:
    """Whether a name from _names is a module of the package (any one its last parts fit), or a file, or an
    attribute of one (a class's fields and annotations count)."""
    if os.path.exists(os.path.join(os.path.dirname(PACKAGE), name)):  # a path from the repository's root
        return True
    if name.endswith(".py"):
        return any(path.endswith(os.sep + name.replace("/", os.sep)) for path in modules.values())
    parts = name.replace("/", ".").split(".")
    for start in sorted(m for m in modules if m == parts[0] or m.endswith("." + parts[0])):
        current, obj = start, importlib.import_module(start)
        for part in parts[1:]:
            if f"{current}.{part}" in modules:
                current = f"{current}.{part}"
                obj = importlib.import_module(current)
            elif hasattr(obj, part) or any(part in getattr(k, "__annotations__", {})
                                           for k in getattr(obj, "__mro__", (obj,))):
                current, obj = "", getattr(obj, part, None)
            else:
                break
        else:
            return True
    return False


def test_every_name_a_docstring_or_internals_md_gives_the_code_exists() -> None:
    """Docstrings and docs/internals.md name modules, classes and functions by their dotted names and paths: each
    one names what the package holds today (a move or a rename updates them)."""
    modules = _modules()
    texts = [(os.path.relpath(path, os.path.dirname(PACKAGE)), node.lineno, node.value.value)
             for path in modules.values() for node in ast.walk(ast.parse(open(path, encoding="utf-8").read()))
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
             and isinstance(node.value.value, str)]
    with open(INTERNALS, encoding="utf-8") as f:
        texts += [("docs/internals.md", number, line) for number, line in enumerate(f, 1)]
    missing = sorted(f"{where}:{line}: {name}" for where, line, text in texts for name in _names(text, modules)
                     if not _resolves(name, modules))
    assert not missing, "names that are not the package's:\n" + "\n".join(missing)


def test_each_class_name_means_one_thing() -> None:
    """A public class is defined in one module only: types are named bare in annotations, docstrings and
    docs/internals.md (`Written`, `SortedBatches`), so two classes of one name would leave a reader guessing."""
    defined: dict[str, list[str]] = {}
    for name, path in _modules().items():
        for node in ast.parse(open(path, encoding="utf-8").read()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(name)
    twice = {name: modules for name, modules in sorted(defined.items()) if len(modules) > 1}
    assert not twice, f"classes defined in more than one module (rename one, or merge them): {twice}"


def test_the_tests_mirror_the_layers() -> None:
    """Each test module sits in the folder of the layer it tests (tests/core/, ..., tests/cli/), or with the
    end-to-end or engine suites (tests/e2e/, tests/engines/); pytest's pythonpath lists every folder, so that
    test modules importing each other's helpers find them."""
    tests = os.path.dirname(os.path.abspath(__file__))
    folders = (*LAYERS, "e2e", "engines")
    astray = sorted(os.path.relpath(os.path.join(folder, name), tests) for folder, _, names in os.walk(tests)
                    for name in names if name.startswith("test_") and name.endswith(".py")
                    and os.path.relpath(folder, tests) not in folders and name != "test_layout.py")
    assert not astray, f"test modules outside the folders {folders}: {astray}"
    with open(os.path.join(os.path.dirname(tests), "pyproject.toml"), encoding="utf-8") as f:
        listed = re.search(r"^pythonpath = \[(.*?)\]", f.read(), re.M | re.S).group(1)
    assert {f"tests/{folder}" for folder in folders} <= set(re.findall(r'"([^"]+)"', listed))
