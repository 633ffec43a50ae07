"""`sm120 monitor --plot OUT`: throughput over time from the monitor's history.

matplotlib is an optional extra (`pip install 'sm120[plot]'`): only this module needs it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sm120.core.errors import SM120Error

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
    """Draw prefill/decode tok/s, running/waiting and (when read) GPU power and utilisation
    over time; returns the sample count."""
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
    gpu_samples = [r for r in samples if r.get("gpus")]
    panels = 3 if gpu_samples else 2
    figure, axes = plt.subplots(panels, 1, sharex=True, figsize=(10, 3 * panels))
    rates, queue = axes[0], axes[1]
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
    if gpu_samples:
        _plot_gpus(axes[2], samples, when)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start))
    axes[-1].set_xlabel(f"{unit} since {stamp}")
    figure.suptitle(f"{title}: throughput")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)
    return len(samples)


def _gpu_series(samples: list[dict[str, Any]], key: str) -> dict[int, list[float | None]]:
    """Per GPU index, the value of `key` at every sample (None where not read)."""
    indices = sorted({int(g["index"]) for r in samples for g in r.get("gpus") or []})
    series: dict[int, list[float | None]] = {i: [] for i in indices}
    for record in samples:
        by_index = {int(g["index"]): g for g in record.get("gpus") or []}
        for index in indices:
            series[index].append(by_index.get(index, {}).get(key))
    return series


def _plot_gpus(power: Any, samples: list[dict[str, Any]], when: list[float]) -> None:
    """Power per GPU (solid, left axis) and utilisation (dotted, right axis)."""
    for index, values in _gpu_series(samples, "power_w").items():
        power.plot(when, values, label=f"GPU{index} W", linewidth=1)
    power.set_ylabel("power (W)")
    power.set_ylim(bottom=0)
    power.grid(alpha=0.3)
    util = power.twinx()
    for index, values in _gpu_series(samples, "util_pct").items():
        util.plot(when, values, label=f"GPU{index} util", linewidth=1, linestyle=":")
    util.set_ylabel("utilisation (%)")
    util.set_ylim(0, 105)
    lines, labels = power.get_legend_handles_labels()
    more_lines, more_labels = util.get_legend_handles_labels()
    power.legend(lines + more_lines, labels + more_labels, loc="upper left", fontsize="small")
