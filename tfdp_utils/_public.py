"""The public home of a class or function defined in a private module.

A public name is defined in a private module (``tfdp_utils.strategy._strategy_choice``) and
exported by a public one (``tfdp_utils``). Python reads ``__module__`` for a class's repr, an
exception's traceback line and pickle's look-up, so the definition names its public home, as
httpx does for every name it exports; a ``StrategyChoice`` returned by ``auto_strategy()``
then reads ``tfdp_utils.StrategyChoice`` even if the user never touched the public name.
Pickle finds the class through the public package's lazy ``__getattr__``.

Put :func:`public` above every other decorator, so that ``dataclasses`` resolves the class's
annotations in the defining module first. What httpx's choice costs here too: tools that look
a class up through its module's globals no longer find the defining module, so on Python 3.11
``typing.get_type_hints(tdu.StrategyChoice)`` cannot resolve the string annotations and
``inspect.getsource`` of a public class fails (functions are unaffected: they keep their
``__globals__`` and code). A leaf: imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_Defined = TypeVar("_Defined")


def public(module: str) -> Callable[[_Defined], _Defined]:
    """A decorator that sets ``__module__`` to ``module``, the public module that exports it.

    Args:
        module: the public package whose ``__all__`` lists the name: ``"tfdp_utils"``, or the
            subpackage that documents it (``"tfdp_utils.callbacks"``).

    Example:
        >>> @public("tfdp_utils")
        ... class StrategyChoice: ...
        >>> StrategyChoice.__module__
        'tfdp_utils'
    """

    def mark(defined: _Defined) -> _Defined:
        defined.__module__ = module
        return defined

    return mark
