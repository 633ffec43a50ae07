#!/usr/bin/env python3
"""In-container health and smoke check (stdlib only, so it runs in any engine image).

healthcheck.py            exit 0 when /health answers 200
healthcheck.py --smoke    also: /v1/models lists the served model and one chat completion
                          returns non-empty content (what READY means)
healthcheck.py --socket S the same over the unix socket a warded engine listens on (it has no
                          TCP port: sm120's ward on the host holds the deployment's)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from typing import Any


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _request(url: str, body: dict[str, Any] | None, key: str | None, timeout: float) -> Any:
    if url.startswith("unix:"):
        return _unix_request(url, body, key, timeout)
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read().decode()
        return json.loads(text) if text.strip().startswith(("{", "[")) else response.status


def _unix_request(url: str, body: dict[str, Any] | None, key: str | None, timeout: float) -> Any:
    """`unix:/path/to/socket:/route`: the same request over a unix socket."""
    path, _, route = url.removeprefix("unix:").rpartition(":")
    connection = _UnixConnection(path, timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        connection.request("POST" if data else "GET", route, data, headers)
        response = connection.getresponse()
        text = response.read().decode()
    finally:
        connection.close()
    if response.status >= 400:
        raise OSError(f"HTTP {response.status}")
    return json.loads(text) if text.strip().startswith(("{", "[")) else response.status


def check(base: str, model: str | None, smoke: bool, timeout: float) -> str | None:
    """None when healthy, else what is wrong (one line)."""
    key = os.environ.get("VLLM_API_KEY")
    try:
        _request(f"{base}/health", None, key, timeout)
        if not smoke:
            return None
        served = [m["id"] for m in _request(f"{base}/v1/models", None, key, timeout)["data"]]
        name = model or served[0]
        if name not in served:
            return f"/v1/models lists {served}, not {name}"
        reply = _request(
            f"{base}/v1/chat/completions",
            {
                "model": name,
                "max_tokens": 16,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Reply with exactly: READY"}],
            },
            key,
            timeout,
        )
        content = reply["choices"][0]["message"].get("content") or ""
        return None if content.strip() else "the smoke completion came back empty"
    except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as exc:
        return f"{base} is not healthy: {exc}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--model", default=os.environ.get("SERVED_MODEL_NAME"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--socket", help="a warded engine's unix socket, instead of --port")
    options = parser.parse_args()
    base = f"unix:{options.socket}:" if options.socket else f"http://127.0.0.1:{options.port}"
    problem = check(base, options.model, options.smoke, options.timeout)
    if problem:
        sys.stderr.write(problem + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
