"""Defaults that the library applies and the command line shows, each stated once.

They sit here, in the bottom layer and free of imports, so that `sm120 --help` can print them
without importing the modules that apply them (see cli/options.py).
"""

from __future__ import annotations

from pathlib import Path

# Where an engine binds when nobody says otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
# vLLM's own default port, for a recipe that names none.
DEFAULT_PORT = 8000
# SIGTERM to the engine, then SIGKILL after this long (`sm120 stop --timeout`, --foreground,
# a failed gate, every runtime's stop()).
STOP_TIMEOUT_S = 30.0
# `sm120 bench --settle`: the pause before each measured phase, so the previous one's
# requests have drained from the engine.
BENCH_SETTLE_S = 2.0
# The .env file a command reads when no --env-file is given (and it exists), as docker
# compose reads it.
DEFAULT_ENV_FILE = Path(".env")
# `sm120 tune --budget`: minutes of launching and measuring before the search stops (the
# final default/leader pairs are counted in it), and `--rounds`: measurements per candidate.
TUNE_BUDGET_MIN = 60.0
TUNE_ROUNDS = 3
