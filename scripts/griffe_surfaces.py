"""The API reference's view of a surface: griffe reads the same one list of names as Python.

mkdocstrings (through griffe) shows the members of ``::: tfdp_utils.strategy`` that the
module's ``__all__`` lists, and reads ``__all__`` from the source without running it. A surface
builds its ``__all__`` at import from its ``name as name`` imports (``tfdp_utils._lazy``), so
this extension hands griffe the names ``_lazy.public_homes`` reads, in ``__all__``'s order.
Named in ``mkdocs.yml``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `mkdocs build` from anywhere
from tfdp_utils._lazy import SURFACE_CALL, export_order, public_homes


class LazySurfaces(griffe.Extension):
    """Gives each lazy surface the ``__all__`` it builds at import."""

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        path = mod.filepath
        if not isinstance(path, Path):
            return
        source = path.read_text()
        if SURFACE_CALL.search(source):
            mod.exports = sorted(public_homes(source, mod.path), key=export_order)
