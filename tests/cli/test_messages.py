"""Messages that name the right thing: an image is not a bad deployment name, and the
commands the READY banner and hints suggest are ones that work."""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from sm120.cli.present import home_relative
from sm120.cli.serving import next_commands
from sm120.engine import docker_api
from tests.helpers import invoke


@pytest.mark.parametrize("target", ["vllm/vllm-openai:v0.32.0", "sha256:0123abcd", "repo/x"])
def test_info_takes_an_image_reference_for_an_image(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    # An engine that holds none of them: what matters is which question info asked.
    monkeypatch.setattr(docker_api, "connect", lambda: object())
    monkeypatch.setattr(docker_api, "get_container", lambda client, ref: None)
    monkeypatch.setattr(docker_api, "images_labelled", lambda client, labels: [])
    monkeypatch.setattr(docker_api, "get_image", lambda client, ref: None)
    assert invoke(cli, "info", target) == (
        2,
        "",
        f"Error: no sm120 image or container matches '{target}' (hint: build one with "
        "'sm120 build RECIPE' or name a deployment, recipe, image or container)\n",
    )


@pytest.mark.parametrize("command", next_commands("demo"))
def test_every_command_the_ready_banner_suggests_is_valid(cli: CliRunner, command: str) -> None:
    # With nothing deployed each must get as far as looking the deployment up: a usage
    # error (an unknown option, an extra argument) would fail differently.
    words = shlex.split(command)
    assert words[0] == "sm120"
    assert invoke(cli, *words[1:]) == (
        2,
        "",
        "Error: no deployment named 'demo' (hint: 'sm120 status' lists them; start one with "
        "'sm120 launch')\n",
    )


def test_a_path_under_home_is_shown_from_tilde(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/ana")
    key = "/home/ana/.local/state/sm120/deployments/glm52-dcp4-mtp/api_key"
    assert home_relative(key) == "~/.local/state/sm120/deployments/glm52-dcp4-mtp/api_key"
    # the banner's line for it fits an 80-column terminal with a long deployment name
    assert len(f"  API key   {home_relative(key)}") <= 80
    assert home_relative("/srv/sm120/deployments/x/api_key") == "/srv/sm120/deployments/x/api_key"
    assert home_relative(None) == "-"
