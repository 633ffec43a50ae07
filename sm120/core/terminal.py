"""Text from a server made safe to write to a terminal.

A model (or whatever answers on its port) can send escape sequences that set the window
title, clear the screen, rewrite earlier lines or, on some terminals, answer back into the
shell. Dropping every control character but newline and tab removes them all, even when a
sequence arrives split across two streamed deltas: without its ESC byte the rest is plain
text.
"""

from __future__ import annotations

import re

# Whole sequences first, so a complete one leaves no debris: CSI (ESC [ ... final byte),
# OSC and the other string commands (ESC ] ... BEL or ST), and two-byte escapes.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
)
# What is left: C0 controls but tab and newline, DEL, and the C1 controls (0x9b is CSI on
# terminals that take 8-bit controls).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))
