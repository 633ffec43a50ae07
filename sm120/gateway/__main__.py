"""`python -m sm120.gateway --host H --port P [--max-awake N] [--swap-wait S]
[--alias NAME=DEPLOYMENT ...] [--normalize-prompts] [--no-usage] [--request-log]
[--busy-share F] [--first-token-hold S]`: the
gateway process that `sm120 gateway start` runs detached (or in the foreground).

`--backends FILE --key-file KEY` is the static mode a compose project runs (sm120.gateway.static):
backends from the file, the gateway's key from KEY."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.gateway.aliases import parse_alias
from sm120.gateway.config import GatewayConfig, TurnPolicy
from sm120.gateway.files import gateway_files
from sm120.gateway.server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120.gateway")
    parser.add_argument("--host", default=GatewayConfig.host)
    parser.add_argument("--port", type=int, default=GatewayConfig.port)
    parser.add_argument("--max-awake", type=int, default=GatewayConfig.max_awake)
    parser.add_argument("--swap-wait", type=float, default=GatewayConfig.swap_wait_s)
    parser.add_argument("--backends", type=Path, default=GatewayConfig.backends_file)
    parser.add_argument("--key-file", type=Path, default=GatewayConfig.key_file)
    parser.add_argument("--alias", action="append", default=[])
    parser.add_argument("--normalize-prompts", action="store_true")
    # benchmarks/proxy_hop.py's "without the log" side; sm120 gateway start always logs.
    parser.add_argument("--no-access-log", dest="access_log", action="store_false")
    parser.add_argument("--no-usage", action="store_true")
    parser.add_argument("--request-log", action="store_true")
    parser.add_argument("--busy-share", type=float, default=TurnPolicy.busy_share)
    parser.add_argument("--first-token-hold", type=float, default=TurnPolicy.first_token_hold_s)
    args = parser.parse_args(argv)
    try:
        config = GatewayConfig(
            args.host, args.port, args.max_awake, args.swap_wait, args.backends, args.key_file,
            tuple(parse_alias(text) for text in args.alias), args.normalize_prompts,
            args.access_log,
            record_usage=not args.no_usage, request_log=args.request_log,
            turns=TurnPolicy(args.busy_share, args.first_token_hold),
        )  # fmt: skip
        serve(config, gateway_files())
    except SM120Error as exc:
        sys.stderr.write(f"Error: {exc.one_line()}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"Error: cannot listen on {args.host}:{args.port}: {exc.strerror}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
