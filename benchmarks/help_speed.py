"""`sm120 --help` wall time against `python -c pass`, measured side by side, alternating.

Run: python benchmarks/help_speed.py [--runs 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    sm120 = shutil.which("sm120") or sys.exit("sm120 is not on PATH: pip install -e . first")
    help_times, pass_times = [], []
    for _ in range(runs):
        help_times.append(wall([sm120, "--help"]))
        pass_times.append(wall([sys.executable, "-c", "pass"]))
    help_median, pass_median = statistics.median(help_times), statistics.median(pass_times)
    print(f"sm120 --help     median {help_median * 1000:7.1f} ms  (goal < 300 ms absolute)")
    print(f"python -c pass   median {pass_median * 1000:7.1f} ms")
    print(f"ratio            {help_median / pass_median:7.2f}x  over {runs} alternating runs")


if __name__ == "__main__":
    main()
