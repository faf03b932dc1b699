"""Public surfaces that load their modules on first use (PEP 562), so imports stay cheap.

``import tfdp_utils`` imports no TensorFlow: each public name is imported from its module the
first time it is used. A package writes each public name once, as an import in the form that
marks a re-export (PEP 484's redundant alias), under ``TYPE_CHECKING`` when it should load
lazily::

    if TYPE_CHECKING:
        from tfdp_utils.strategy._strategy_choice import StrategyChoice as StrategyChoice

    __all__, __getattr__, __dir__ = surface(globals())

and :func:`surface` reads the package's own source (one ``ast.parse`` of its ``__init__.py``,
well under a millisecond) for those imports: they give the table ``name -> defining module``
that ``__getattr__`` loads from, and a sorted ``__all__`` that ``dir()`` and tab completion
show. A name imported that way outside ``TYPE_CHECKING`` is public too, already loaded.

Why this design: the import list is the one that type checkers, linters and mkdocstrings
already read (mypy and pyright take the redundant alias as an explicit re-export, so
``from tfdp_utils import StrategyChoice`` type-checks for users without a literal ``__all__``),
so deriving the loader's table and ``__all__`` from it leaves nothing to keep in step: a
hand-written table, a literal ``__all__`` or a generated file could each drift from the
imports, and a generator would need a script and a test that it was run. It is
``lazy_loader.attach_stub``'s idea without the separate ``.pyi`` file. The cost: the
package's ``__init__.py`` source must be installed (a ``.pyc``-only build cannot be imported;
wheels and source installs always carry it).

Where a public name is defined, ``tfdp_utils._public.public`` names its public home, so that
reprs, tracebacks and pickles read ``tfdp_utils.StrategyChoice`` instead of the private module
(``tests/test_public_module.py`` checks both lists agree).
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

SURFACE_CALL = re.compile(r"^__all__, __getattr__, __dir__ = surface\(globals\(\)", re.M)
"""The line that makes a package's ``__init__`` a surface (read by its tests and the docs)."""


def surface(
    namespace: dict[str, Any], *, defined: Iterable[str] = ()
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for the package whose globals are ``namespace``.

    Args:
        namespace: the package's ``globals()``; a name is cached there once resolved.
        defined: public names the package assigns itself rather than imports
            (``__version__``). Defaults to none.

    Returns:
        The package's public names sorted as ruff's RUF022 sorts an ``__all__`` (CONSTANTS,
        then Classes, then functions and modules), its module ``__getattr__``, and its
        ``__dir__``.

    Raises:
        ImportError: the package's source is not installed, so its public names are unknown.
    """
    package: str = namespace["__name__"]
    homes = public_homes(_source(namespace), package)
    public = sorted([*homes, *defined], key=export_order)

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return list(public)

    return public, __getattr__, __dir__


def public_homes(source: str, package: str) -> dict[str, str]:
    """Public name -> the module that defines it, read from a package ``__init__``'s ``source``.

    A name is public when imported with a redundant alias (``from m import X as X``) at the
    module's top level or inside a top-level ``if`` (``TYPE_CHECKING``). A subpackage imported
    from the package itself (``from tfdp_utils import errors as errors``) maps to its own name.
    """
    homes: dict[str, str] = {}
    for node in top_level_statements(ast.parse(source).body):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        for alias in node.names:
            if alias.asname == alias.name:
                homes[alias.name] = f"{module}.{alias.name}" if module == package else module
    return homes


def export_order(name: str) -> tuple[int, str]:
    """RUF022's order for ``__all__``: SCREAMING_CASE, then CamelCase, then everything else."""
    if name.isupper():
        return 0, name
    return (1 if name[:1].isupper() else 2), name


def top_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` and of the ``if`` blocks in it, not of functions or classes."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from top_level_statements(node.body)
            yield from top_level_statements(node.orelse)


def _source(namespace: dict[str, Any]) -> str:
    spec = namespace.get("__spec__")
    get_source = getattr(getattr(spec, "loader", None), "get_source", None)
    source = get_source(spec.name) if spec is not None and get_source is not None else None
    if not isinstance(source, str):
        raise ImportError(
            f"{namespace['__name__']} reads its public names from its own source, which is not "
            "installed here (a .pyc-only build?); reinstall tfdp-utils from its wheel or sdist."
        )
    return source
