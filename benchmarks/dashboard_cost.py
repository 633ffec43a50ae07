"""What the web dashboard costs: its first paint in headless Chromium, and the CPU of the
process serving it while a browser watches, with the engine kept busy.

One real tiny vLLM (CPU build) with its monitor and the gateway in front (the gateway serves
/dashboard), started by sm120 in a throwaway state directory and stopped at the end. A thread
keeps the engine decoding (streamed chats straight to it, not through the gateway, so the
gateway's CPU is the dashboard's). Chromium signs in, then reloads the page --reloads times
(first-contentful-paint from the Paint Timing API, median and worst), then watches it for
--watch-s seconds while the gateway process's CPU time (/proc/PID/stat) is read before and
after. Needs Debian's chromium and chromium-driver.

Run: VLLM_PYTHON=... python benchmarks/dashboard_cost.py [--reloads 10] [--watch-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from bare_engine import free_port
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from sm120.engine.tiny_model import ensure_tiny_model

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAINT = (
    "const p = performance.getEntriesByName('first-contentful-paint')[0];"
    "return p ? p.startTime : null;"
)


def sm120(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SM120_HOME": str(home), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "sm120", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def keep_busy(url: str, key: str, stop: threading.Event) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "List fruit, one per line."}],
        "max_tokens": 128,
        "stream": True,
    }
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"}) as http:
        while not stop.is_set():
            with http.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
                for _ in answer.iter_lines():
                    if stop.is_set():
                        break


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,900")
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def measure(
    home: Path, page: str, key: str, gateway_pid: int, args: argparse.Namespace
) -> dict[str, float]:
    driver = browser()
    try:
        driver.get(page)
        driver.find_element(By.ID, "key").send_keys(key)
        driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        paints = []
        for _ in range(args.reloads):
            driver.get(page)
            deadline = time.monotonic() + 10
            paint = None
            while paint is None and time.monotonic() < deadline:
                paint = driver.execute_script(PAINT)
                time.sleep(0.05)
            paints.append(float(paint) if paint is not None else float("nan"))
        before, began = cpu_seconds(gateway_pid), time.monotonic()
        time.sleep(args.watch_s)
        used, wall = cpu_seconds(gateway_pid) - before, time.monotonic() - began
    finally:
        driver.quit()
    return {
        "first_paint_ms_median": round(statistics.median(paints), 1),
        "first_paint_ms_worst": round(max(paints), 1),
        "reloads": args.reloads,
        "dashboard_cpu_pct_of_a_core": round(100 * used / wall, 2),
        "watched_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=10)
    parser.add_argument("--watch-s", type=float, default=60.0)
    args = parser.parse_args()
    engine_python = Path(os.environ["VLLM_PYTHON"])
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        model = ensure_tiny_model(engine_python, Path(scratch) / "tiny", print)
        port, gateway_port = free_port(), free_port()
        launched = sm120(
            home, "launch", "tiny", "--port", str(port), "--model-dir", str(model),
            "--vllm-python", str(engine_python),
        )  # fmt: skip
        if launched.returncode != 0:
            sys.exit(launched.stderr[-2000:])
        stop = threading.Event()
        try:
            started = sm120(home, "gateway", "start", "--port", str(gateway_port))
            if started.returncode != 0:
                sys.exit(started.stderr)
            gateway_pid = json.loads(sm120(home, "gateway", "status", "--json").stdout)["pid"]
            key = (home / "gateway" / "api_key").read_text().strip()
            engine_key = (home / "deployments" / "tiny" / "api_key").read_text().strip()
            busy = threading.Thread(
                target=keep_busy, args=(f"http://127.0.0.1:{port}", engine_key, stop), daemon=True
            )
            busy.start()
            page = f"http://127.0.0.1:{gateway_port}/dashboard"
            print(json.dumps(measure(home, page, key, gateway_pid, args), indent=2))
        finally:
            stop.set()
            sm120(home, "gateway", "stop")
            sm120(home, "stop", "tiny")


if __name__ == "__main__":
    main()
