"""Public surfaces that load their modules on first use (PEP 562), so imports stay cheap.

``import tfdp_utils`` imports no TensorFlow: each public name is looked up in a table of
``name -> defining module`` and imported the first time it is used. Every package of
tfdp-utils that exposes names builds its ``__getattr__``/``__dir__`` here, so ``dir()`` and tab
completion show exactly the package's ``__all__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def surface(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names live in ``homes``.

    Args:
        package: the package's ``__name__``.
        homes: public name -> the module that defines it (a module itself when the name is a
            subpackage, e.g. ``"callbacks" -> "tfdp_utils.callbacks"``).
        namespace: the package's ``globals()``; a resolved name is cached there.
        public: the package's ``__all__``.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__
