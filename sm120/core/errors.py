"""The one error type users see: a one-line message plus a hint naming the next step.

The CLI maps every SM120Error to one line on stderr and exit code 2, in one place
(sm120.cli.errors); with SM120_DEBUG=1 it re-raises it, traceback and all. Any other
exception is a bug and always ends in its traceback.
"""

from __future__ import annotations


class SM120Error(Exception):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message.replace("\n", " ").strip()
        if self.hint:
            text += f" (hint: {self.hint.replace(chr(10), ' ').strip()})"
        return text


class RecipeError(SM120Error):
    """A recipe file that does not load or validate."""


class PlanError(SM120Error):
    """Overrides or derived values that cannot be turned into a launch plan."""


class RuleViolation(SM120Error):
    """At least one fail-fast rule rejected the plan."""
