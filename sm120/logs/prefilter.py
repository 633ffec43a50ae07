"""Literal prefilters for sets of regexes: run a regex only where it can possibly match.

Most log lines match none of the patterns a log reader looks for. Trying every pattern on
every line is the slow way; here each pattern gets a literal that any match must contain
(`required_literal`), each literal is cut to start at a character that is rare in the text
(`rare_anchor`), and one regex (`alternation`) finds all of them in a single pass at C speed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# Characters that start a fixed-length escape: how many characters follow the letter.
_ESCAPE_LENGTH = {"x": 2, "u": 4, "U": 8}


def required_literal(pattern: str, *, minimum: int = 3) -> str | None:
    """The longest run of plain characters every match of `pattern` contains, or None.

    Conservative by design, so a prefilter built on it never hides a match: alternation at
    the top level or inline flags at the start give None; groups, classes, class escapes
    (\\d, \\s, ...), anchors and any character a quantifier may repeat or drop end a run.
    Runs shorter than `minimum` do not count.
    """
    if pattern.startswith("(?") and pattern[2:3].isalpha():
        return None
    if _has_top_level_bar(pattern):
        return None
    best, run = "", ""
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            escaped = pattern[index + 1 : index + 2]
            if escaped and not escaped.isalnum():
                run += escaped
                index += 2
                continue
            best, run = _longer(best, run), ""
            index = _skip_escape(pattern, index)
        elif char == "[":
            best, run = _longer(best, run), ""
            index = _skip_class(pattern, index)
        elif char == "(":
            best, run = _longer(best, run), ""
            index = _skip_group(pattern, index)
        elif char in "*?{+":
            # The atom before may vanish (*, ?, {0,...}) or repeat (+): "ab+c" holds "ab"
            # but not "abc"; for the others keep only what came before that atom.
            if char != "+":
                run = run[:-1]
            best, run = _longer(best, run), ""
            index = _skip_quantifier(pattern, index)
        elif char in ".^$|)":
            best, run = _longer(best, run), ""
            index += 1
        else:
            run += char
            index += 1
    best = _longer(best, run)
    return best if len(best) >= minimum else None


def rare_anchor(literal: str, by_frequency: str, *, minimum: int = 6) -> str:
    """The suffix of `literal` that starts at its rarest character (at least `minimum` long).

    Any suffix of a required literal is required too. A regex alternation is tried at every
    position holding the first character of one of its alternatives, so starting where that
    character is rare makes it try fewer positions. `by_frequency` lists characters from the
    most to the least frequent in the text to search; unlisted characters count as rarest.
    """
    if len(literal) <= minimum:
        return literal

    def rarity(index: int) -> tuple[int, int]:
        position = by_frequency.find(literal[index])
        return (len(by_frequency) if position < 0 else position, -index)

    return literal[max(range(len(literal) - minimum + 1), key=rarity) :]


def alternation(anchors: list[str]) -> re.Pattern[str]:
    """One regex matching any of `anchors`, grouped by first character.

    At each candidate position the regex engine checks the top-level alternatives one by one;
    grouping makes that one check per distinct first character instead of one per anchor.
    Within a group the longest anchor comes first, so `match.group()` is the longest anchor
    found at that position (see `prefix_closure` for the shorter ones it hides).
    """
    groups: dict[str, list[str]] = {}
    for anchor in anchors:
        groups.setdefault(anchor[0], []).append(anchor[1:])
    parts = []
    for first, rests in sorted(groups.items()):
        tails = "|".join(re.escape(rest) for rest in sorted(rests, key=len, reverse=True))
        parts.append(re.escape(first) + (f"(?:{tails})" if len(rests) > 1 else tails))
    return re.compile("|".join(parts))


def prefix_closure(anchors: list[str]) -> dict[str, tuple[str, ...]]:
    """For each anchor, itself and every other anchor it starts with (found at the same spot)."""
    return {
        anchor: tuple(other for other in anchors if anchor.startswith(other)) for anchor in anchors
    }


def _longer(best: str, run: str) -> str:
    return run if len(run) > len(best) else best


def _skip_escape(pattern: str, index: int) -> int:
    """Past a letter or digit escape: \\d, \\x41, \\u00e9, \\N{...}, \\12 (group or octal)."""
    letter = pattern[index + 1 : index + 2]
    index += 2
    if letter in _ESCAPE_LENGTH:
        return index + _ESCAPE_LENGTH[letter]
    if letter == "N" and pattern[index : index + 1] == "{":
        close = pattern.find("}", index)
        return close + 1 if close >= 0 else len(pattern)
    if letter.isdigit():
        while index < len(pattern) and pattern[index].isdigit():
            index += 1
    return index


def _skip_class(pattern: str, index: int) -> int:
    index += 1
    if pattern[index : index + 1] == "^":
        index += 1
    if pattern[index : index + 1] == "]":
        index += 1
    while index < len(pattern) and pattern[index] != "]":
        index += 2 if pattern[index] == "\\" else 1
    return index + 1


def _skip_group(pattern: str, index: int) -> int:
    for position, char, depth in _walk(pattern, index):
        if char == ")" and depth == 0:
            return position + 1
    return len(pattern)


def _skip_quantifier(pattern: str, index: int) -> int:
    if pattern[index] == "{":
        close = pattern.find("}", index)
        index = close + 1 if close >= 0 else index + 1
    else:
        index += 1
    if pattern[index : index + 1] in ("?", "+"):  # lazy or possessive
        index += 1
    return index


def _has_top_level_bar(pattern: str) -> bool:
    return any(char == "|" and depth == 0 for _, char, depth in _walk(pattern, 0))


def _walk(pattern: str, index: int) -> Iterator[tuple[int, str, int]]:
    """Each character from `index` on that is not escaped or inside a [class], with the group
    depth after it: an opening "(" stands inside its group, a closing ")" outside."""
    depth = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if char == "[":
            index = _skip_class(pattern, index)
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        yield index, char, depth
        index += 1
