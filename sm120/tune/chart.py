"""The objective per candidate, drawn: bars on a terminal and a small SVG beside the result.

Both are built from the result document alone, so `sm120 tune NAME --show` redraws a kept
result without measuring anything."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

BAR_WIDTH = 40
SVG_ROW = 22
SVG_LABEL = 360
SVG_BAR = 320


def _rows(document: dict[str, Any]) -> list[tuple[str, float | None, str]]:
    """(label, value, mark) per candidate: `*` the winner, `=` the default."""
    winner = (document.get("winner") or {}).get("key")
    rows = []
    for outcome in document.get("candidates", []):
        mark = "*" if outcome["key"] == winner else ("=" if outcome["label"] == "default" else " ")
        value = outcome.get("value")
        rows.append((outcome["label"], value if isinstance(value, int | float) else None, mark))
    return rows


def bars(document: dict[str, Any], width: int = BAR_WIDTH) -> list[str]:
    """One line per candidate: a bar scaled to the best, the figure, and why not if none."""
    rows = _rows(document)
    values = [v for _, v, _ in rows if v is not None]
    top = max(values) if values else 1.0
    unit = document.get("unit", "")
    label_width = min(48, max((len(label) for label, _, _ in rows), default=7))
    lines = []
    reasons = {o["label"]: o.get("reason") or o["status"] for o in document.get("candidates", [])}
    for label, value, mark in rows:
        shown = label if len(label) <= label_width else label[: label_width - 1] + "~"
        if value is None:
            lines.append(f"{mark} {shown:<{label_width}}  ({reasons.get(label)})")
            continue
        length = max(1, round(width * value / top)) if top else 1
        lines.append(f"{mark} {shown:<{label_width}}  {'#' * length:<{width}} {value:,.2f} {unit}")
    return lines


def svg(document: dict[str, Any]) -> str:
    rows = _rows(document)
    values = [v for _, v, _ in rows if v is not None]
    top = max(values) if values else 1.0
    height = SVG_ROW * (len(rows) + 2)
    width = SVG_LABEL + SVG_BAR + 140
    title = html.escape(
        f"sm120 tune {document.get('key', '')}: {document.get('objective_label', '')} "
        f"({document.get('unit', '')}, {'higher' if document.get('higher_is_better') else 'lower'}"
        " is better)"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="12">',
        f'<text x="4" y="16">{title}</text>',
    ]
    for index, (label, value, mark) in enumerate(rows):
        y = SVG_ROW * (index + 1) + 8
        colour = {"*": "#2a7", "=": "#888"}.get(mark, "#47c")
        parts.append(f'<text x="4" y="{y + 12}">{html.escape(mark + " " + label[:52])}</text>')
        if value is None:
            parts.append(f'<text x="{SVG_LABEL}" y="{y + 12}" fill="#a33">not measured</text>')
            continue
        length = max(1, round(SVG_BAR * value / top)) if top else 1
        parts.append(
            f'<rect x="{SVG_LABEL}" y="{y}" width="{length}" height="14" fill="{colour}"/>'
        )
        parts.append(f'<text x="{SVG_LABEL + length + 6}" y="{y + 12}">{value:,.2f}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_svg(document: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(svg(document))
    return path
