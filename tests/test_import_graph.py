"""The package's walls, read from its own imports: no cycle, leaves that import nothing of
ours, no module imported by a string, and every arrow pointing down the declared order.

Every ``import`` / ``from ... import`` of a ``tfdp_utils`` module counts: at module level,
inside functions and under ``TYPE_CHECKING`` (an arrow a type checker follows is an arrow).
The order is the README's architecture map, bottom to top; a module may import its own layer
(without a cycle) and the layers below it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfdp_utils._lazy import SURFACE_CALL, public_homes, top_level_statements

pytestmark = pytest.mark.pure

PACKAGE = Path(__file__).resolve().parent.parent / "tfdp_utils"

LEAVES = (
    "tfdp_utils.errors",
    "tfdp_utils._validate",
    "tfdp_utils._variables",
    "tfdp_utils._waiting",
    "tfdp_utils._versions",
    "tfdp_utils._lazy",
    "tfdp_utils._public",
)
"""The floor: modules every pillar may import, which import nothing of the package."""

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        *LEAVES,
        "tfdp_utils._known_issues",
        "tfdp_utils._dataset_info",
        "tfdp_utils._exit_guard",
        "tfdp_utils._exit_barrier",
        "tfdp_utils._helper_calls",
        "tfdp_utils._interrupts",
        "tfdp_utils._checkpoint_files",
    ),
    ("tfdp_utils._tf",),
    ("tfdp_utils.cluster",),
    ("tfdp_utils.schedules", "tfdp_utils.batching"),
    ("tfdp_utils.compat",),
    ("tfdp_utils.training",),
    ("tfdp_utils.data",),
    ("tfdp_utils.strategy",),
    ("tfdp_utils.preemption",),
    ("tfdp_utils.throughput",),
    ("tfdp_utils.callbacks",),
    (
        "tfdp_utils.doctor._check",
        "tfdp_utils.doctor._comparison",
        "tfdp_utils.doctor._equivalence",
    ),
    ("tfdp_utils", "tfdp_utils.doctor"),  # the public surfaces
    (
        "tfdp_utils.doctor._checks",
        "tfdp_utils.doctor._command",
        "tfdp_utils.demo",
        "tfdp_utils.cli",
    ),
)
"""Bottom to top. A name matches a module and everything under it; the longest match wins."""

LAZY_SURFACE = "tfdp_utils._lazy"
"""The one module that imports by name: a surface's public names (PEP 562), each written as
an import (under ``TYPE_CHECKING`` when lazy) that this reader counts as an arrow (checked
below)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _known(name: str) -> str:
    """The package module an imported name lives in (``a.b.c`` -> ``a.b`` for a name ``c``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of a package module in ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tfdp_utils":
                    yield node.lineno, _known(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "tfdp_utils":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                yield node.lineno, full if full in MODULES else _known(target)


GRAPH = {
    module: {target for _, target in _imports(module) if target != module} for module in MODULES
}


def _layer(module: str) -> int:
    best, found = -1, None
    for index, layer in enumerate(LAYERS):
        for name in layer:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), index
    assert found is not None, f"{module} is in no layer of LAYERS: place it in the order"
    return found


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(GRAPH[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    return found


def test_the_graph_is_read() -> None:
    # The reader finds the arrows it must (a broken reader would pass every rule below).
    assert len(MODULES) > 80
    assert "tfdp_utils._tf" in GRAPH["tfdp_utils.schedules"]
    assert "tfdp_utils.compat._changes" in GRAPH["tfdp_utils.data._attach"]
    # Under TYPE_CHECKING and inside functions too.
    assert "tfdp_utils.strategy._strategy_choice" in GRAPH["tfdp_utils.strategy._build"]
    assert "tfdp_utils.cluster._coordination" in GRAPH["tfdp_utils.strategy._build"]


def test_no_import_cycles() -> None:
    assert _cycles() == []


def test_leaves_import_nothing_of_the_package() -> None:
    assert {leaf: sorted(GRAPH[leaf]) for leaf in LEAVES if GRAPH[leaf]} == {}


def test_every_arrow_points_down_the_declared_order() -> None:
    upward = [
        f"{module}:{line} imports {target} (layer {_layer(target)} above {_layer(module)})"
        for module in sorted(MODULES)
        for line, target in _imports(module)
        if target != module and _layer(target) > _layer(module)
    ]
    assert upward == []


def test_no_package_module_is_imported_by_a_string() -> None:
    by_name = []
    for module, path in MODULES.items():
        if module == LAZY_SURFACE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, (ast.Attribute, ast.Name))
                and getattr(node.func, "attr", getattr(node.func, "id", ""))
                in (
                    "import_module",
                    "__import__",
                )
            ):
                by_name.append(f"{module}:{node.lineno}")
    assert by_name == []


def _surfaces() -> Iterator[tuple[str, dict[str, str]]]:
    """(package, its public names -> home module) for every package whose surface
    ``_lazy.surface`` derives from its imports."""
    for module, path in MODULES.items():
        source = path.read_text()
        if SURFACE_CALL.search(source):
            yield module, public_homes(source, module)


def _bound_names(module: str) -> set[str]:
    """The names ``module`` binds at its top level (or under a top-level ``if``)."""
    names: set[str] = set()
    for node in top_level_statements(ast.parse(MODULES[module].read_text()).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def test_every_public_name_is_written_once_as_an_import() -> None:
    surfaces = dict(_surfaces())
    assert len(surfaces) >= 8  # tfdp_utils and its subpackages
    assert "StrategyChoice" in surfaces["tfdp_utils"]  # the reader finds them
    # No second list beside the imports: no hand-written table, no literal __all__.
    second_lists = [
        package
        for package in surfaces
        if re.search(r"^(_HOMES|__all__)\s*[:=]", MODULES[package].read_text(), re.M)
    ]
    assert second_lists == []
    # Each import names a module of the package that binds the name (or is that subpackage).
    unbound = [
        f"{package}: {name} -> {home}"
        for package, homes in surfaces.items()
        for name, home in homes.items()
        if home != f"{package}.{name}" and (home not in MODULES or name not in _bound_names(home))
    ]
    assert unbound == []


def test_the_readme_map_names_every_module() -> None:
    readme = (PACKAGE.parent / "README.md").read_text()
    section = readme[readme.index("## Architecture") : readme.index("`tests/` mirrors the package")]
    workaround = re.compile(r"_(keras|tf)_\d+\.py")  # one per upstream issue, named by pattern
    unnamed = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py"
        and f"`{path.name}`" not in section
        and not workaround.fullmatch(path.name)
    ]
    assert unnamed == []
