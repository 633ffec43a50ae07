"""`sm120 monitor --plot OUT`: throughput over time from the monitor's history.

matplotlib is an optional extra (`pip install 'sm120[plot]'`): only this module needs it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sm120.errors import SM120Error

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


class PlotError(SM120Error):
    """The plot cannot be drawn."""


def check_plot_path(out: Path) -> None:
    if out.suffix.lower() not in PLOT_SUFFIXES:
        raise PlotError(
            f"--plot {out}: the file name must end in .png, .svg or .pdf",
            "e.g. sm120 monitor --plot throughput.png",
        )


def plot_history(records: Iterable[dict[str, Any]], out: Path, title: str) -> int:
    """Draw prefill/decode tok/s and running/waiting over time; returns the sample count."""
    check_plot_path(out)
    samples = [r for r in records if isinstance(r.get("t"), (int, float))]
    rated = [r for r in samples if isinstance(r.get("decode_tps"), (int, float))]
    if not rated:
        raise PlotError(
            f"no throughput history yet for {title}",
            "the monitor records a sample every poll once the server is up; try again later",
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            "--plot needs matplotlib, which is not installed",
            "pip install 'sm120[plot]'",
        ) from None
    start = float(samples[0]["t"])
    span_h = (float(samples[-1]["t"]) - start) / 3600
    # Hours read better than minutes once the history spans a few of them.
    scale, unit = (3600.0, "hours") if span_h > 3 else (60.0, "minutes")
    when = [(float(r["t"]) - start) / scale for r in samples]
    figure, (rates, queue) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    for key, label in (("prefill_tps", "prefill tok/s"), ("decode_tps", "decode tok/s")):
        rates.plot(when, [r.get(key) for r in samples], label=label, linewidth=1)
    rates.set_ylabel("tokens / s")
    rates.legend(loc="upper left")
    rates.grid(alpha=0.3)
    for key in ("running", "waiting"):
        queue.step(when, [r.get(key) for r in samples], label=key, where="post", linewidth=1)
    queue.set_ylabel("requests")
    queue.legend(loc="upper left")
    queue.grid(alpha=0.3)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start))
    queue.set_xlabel(f"{unit} since {stamp}")
    figure.suptitle(f"{title}: throughput")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)
    return len(samples)
