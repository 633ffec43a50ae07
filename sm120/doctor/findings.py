"""What a doctor check reports: one finding per question, with what to do about it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["ok", "info", "warn", "error"]
SEVERITIES: tuple[Severity, ...] = ("ok", "info", "warn", "error")


@dataclass(frozen=True)
class Finding:
    """One answer. `error` blocks a launch; `warn` is likely trouble; `info` is context."""

    id: str
    severity: Severity
    message: str
    remediation: str = ""
    # The failure-catalogue entry this finding prevents or explains (F10, F18, ...).
    failure: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def blocking(self) -> bool:
        return self.severity == "error"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "remediation": self.remediation,
        }
        if self.failure:
            out["failure"] = self.failure
        if self.data:
            out["data"] = self.data
        return out


def blocking(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.blocking]


def worst(findings: Iterable[Finding]) -> Severity:
    ranks = [SEVERITIES.index(f.severity) for f in findings]
    return SEVERITIES[max(ranks)] if ranks else "ok"
