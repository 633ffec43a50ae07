"""Stands in for an engine whose core dies during start-up while its API process lives on.

Run as `python tests/fakes/standin_engine.py <the engine argv after the interpreter>`: the tests
wrap it as the engine's Python (native runtime) or install it as vLLM's API server module (a
container). It starts one child, as vLLM starts its engine core, then prints the log lines of
the file STANDIN_LOG names (tests/data/fatal_startups/; IMAGE_LOG when unset), STANDIN_DELAY
seconds apart, and hangs like vLLM's API process waiting on a dead core, until it is signalled.
The child hangs too, so a test sees whether stopping the engine ends everything it started.
Standard library only: the container image has nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

CORE_FLAG = "--standin-core"
# Where a container image built for the tests keeps the log to print.
IMAGE_LOG = "/opt/standin/startup.log"


def main() -> None:
    argv = sys.argv[1:]
    if CORE_FLAG in argv:
        while True:
            time.sleep(60)
    # The engine core: same command line, so a test finds it by the port like the server.
    subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, CORE_FLAG])
    delay = float(os.environ.get("STANDIN_DELAY", "0.05"))
    with open(os.environ.get("STANDIN_LOG", IMAGE_LOG), encoding="utf-8") as log:
        for line in log:
            sys.stdout.write(line)
            sys.stdout.flush()
            time.sleep(delay)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
