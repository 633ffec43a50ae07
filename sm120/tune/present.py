"""A tune result on a terminal: the table, the bar chart, the verdict and the winning settings.
Read from the result document only (the saved one is the same)."""

from __future__ import annotations

from typing import Any

from sm120.deploy.tuned import gain_text
from sm120.tune.chart import bars


def _figure(value: Any, unit: str) -> str:
    return f"{value:,.2f} {unit}" if isinstance(value, int | float) else "-"


def result_lines(document: dict[str, Any]) -> list[str]:
    unit = document.get("unit", "")
    direction = "higher" if document.get("higher_is_better") else "lower"
    lines = [
        f"sm120 tune {document['key']}: {document['objective_label']} ({unit}, {direction} is "
        f"better) on {document['workload_description']}",
        "",
        f"{'candidate':<48} {'status':<9} {'median':>14}  samples / why",
    ]
    for outcome in document.get("candidates", []):
        samples = ", ".join(f"{s:,.2f}" for s in outcome.get("samples", []))
        lines.append(
            f"{outcome['label'][:48]:<48} {outcome['status']:<9} "
            f"{_figure(outcome.get('value'), unit):>14}  {samples or outcome.get('reason') or ''}"
        )
    lines += ["", *bars(document), ""]
    pairs = document.get("pairs", [])
    if pairs:
        lines.append("pairs (default, leader), alternating:")
        lines += [
            f"  {i + 1}. {p['default']:,.2f} / {p['leader']:,.2f} "
            f"({'leader' if p['leader_first'] else 'default'} first)"
            for i, p in enumerate(pairs)
        ]
    found = document.get("verdict", {})
    if "change_pct" in found:
        lines.append(
            f"median change {found['change_pct']:+.2f}% (pairs from {found['lowest_pct']:+.2f}% "
            f"to {found['highest_pct']:+.2f}%, noise ±{found['noise_pct']:.2f}%): {found['why']}"
        )
    else:
        lines.append(found.get("why", ""))
    winner = document.get("winner", {})
    lines.append(f"result: {gain_text(document)}")
    lines.append(f"winning settings: {' '.join(winner.get('sets', [])) or 'the default'}")
    if document.get("untried"):
        lines.append(f"the budget left about {document['untried']} candidates untried")
    lines.append(f"kept for this host: {document['saved']} (chart {document['chart']})")
    return lines
