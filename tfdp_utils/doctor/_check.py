"""One line of ``tfdp-utils doctor``'s table: what was checked and what was found. Pure."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Status = Literal["PASS", "FAIL", "WARN", "SKIP", "INFO"]


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of the doctor's table.

    Attributes:
        section: ``"versions"``, ``"known issues"`` or ``"self-tests"``.
        name: what was checked.
        status: PASS / FAIL (exit code 1) / WARN / SKIP / INFO.
        detail: the finding, in a few words.
        seconds: how long a self-test took, or None.
        url: the upstream issue, for known issues.
    """

    section: str
    name: str
    status: Status
    detail: str
    seconds: float | None = None
    url: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The check as a JSON-ready dict."""
        return dataclasses.asdict(self)
