"""Flags that close engine routes the API key does not guard, added when the server is
reachable from other machines; loopback renders stay byte for byte what they were."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.helpers import invoke


def _argv(cli: CliRunner, *args: str) -> list[str]:
    code, out, err = invoke(cli, "launch", "tiny", "--dry-run", "--json", *args)
    assert code == 0, err
    return list(json.loads(out)["argv"])


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "gpu-box.lan"])
def test_a_server_beyond_loopback_has_no_fastapi_docs(cli: CliRunner, host: str) -> None:
    assert _argv(cli, "--host", host).count("--disable-fastapi-docs") == 1


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_a_loopback_render_is_unchanged(cli: CliRunner, host: str) -> None:
    assert "--disable-fastapi-docs" not in _argv(cli, "--host", host)


def test_the_flag_is_not_doubled_when_the_recipe_sets_it(cli: CliRunner) -> None:
    argv = _argv(cli, "--host", "0.0.0.0", "--set", "disable-fastapi-docs=true")
    assert argv.count("--disable-fastapi-docs") == 1
