"""`sm120 connect`: what each client is told, eval'd and written, against a real detached
gateway process (no engine), and every refusal in one line. Claude Code and the SDKs talking
through it for real are in tests/integration/test_agent_clients.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomlkit
from typer.testing import CliRunner

from sm120.gateway.connect import Endpoint, settings_for, write_client_config
from sm120.gateway.control import stop_gateway
from sm120.gateway.files import gateway_files
from tests.helpers import free_port, invoke, one_line_error


@pytest.fixture
def gateway(
    cli: CliRunner, isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """A running gateway (no deployments behind it) and a HOME of the test's own."""
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    port = free_port()
    code, _, err = invoke(cli, "gateway", "start", "--port", str(port))
    assert code == 0, err
    files = gateway_files()
    yield {"root": f"http://127.0.0.1:{port}", "key": files.api_key.read_text().strip(),
           "key_file": str(files.api_key)}  # fmt: skip
    stop_gateway(files)


def test_claude_code_settings_name_the_gateway_and_never_the_key(
    cli: CliRunner, gateway: dict[str, str]
) -> None:
    code, out, _ = invoke(cli, "connect", "claude-code", "--model", "tiny")
    assert code == 0
    assert out.splitlines()[:2] == [
        f"claude-code -> the gateway at {gateway['root']} (model tiny)",
        f"key: in {gateway['key_file']} (sm120 connect ... --show-key prints it)",
    ]
    assert f"  ANTHROPIC_BASE_URL={gateway['root']}" in out.splitlines()
    assert "  ANTHROPIC_DEFAULT_HAIKU_MODEL=tiny" in out.splitlines()
    assert gateway["key"] not in out
    code, out, _ = invoke(cli, "connect", "claude-code", "--model", "tiny", "--show-key")
    assert out.splitlines()[-1] == f"key: {gateway['key']}"


def test_shell_lines_evaluate_to_the_key_read_from_its_file(
    cli: CliRunner, gateway: dict[str, str]
) -> None:
    code, out, _ = invoke(cli, "connect", "openai", "--model", "tiny", "--shell")
    assert code == 0 and gateway["key"] not in out
    shown = subprocess.run(
        ["sh", "-c", out + '\necho "$OPENAI_BASE_URL|$OPENAI_MODEL|$OPENAI_API_KEY"'],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert shown == f"{gateway['root']}/v1|tiny|{gateway['key']}"


def test_write_merges_claude_settings_and_its_helper_prints_the_key(
    cli: CliRunner, gateway: dict[str, str]
) -> None:
    settings = Path(os.environ["HOME"]) / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(
        json.dumps({"permissions": {"allow": ["Bash(ls)"]}, "env": {"ANTHROPIC_API_KEY": "old"}})
    )
    code, out, _ = invoke(cli, "connect", "claude-code", "--model", "tiny", "--write")
    written = json.loads(settings.read_text())
    assert code == 0 and out.startswith(f"wrote {settings}: ANTHROPIC_BASE_URL, ")
    assert out.rstrip().endswith("apiKeyHelper, ANTHROPIC_API_KEY (removed)")
    assert written["permissions"] == {"allow": ["Bash(ls)"]}
    assert "ANTHROPIC_API_KEY" not in written["env"]
    assert written["env"]["ANTHROPIC_BASE_URL"] == gateway["root"]
    assert gateway["key"] not in settings.read_text()
    helper = subprocess.run(
        ["/bin/sh", "-c", written["apiKeyHelper"]], capture_output=True, text=True
    )
    assert helper.stdout.strip() == gateway["key"]
    assert oct(settings.stat().st_mode & 0o777) == "0o600"


def test_write_merges_codex_config_keeping_the_users_own_lines(
    cli: CliRunner, gateway: dict[str, str]
) -> None:
    config = Path(os.environ["HOME"]) / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        '# mine\napproval_policy = "on-request"\n\n[model_providers.other]\nname = "x"\n'
    )
    code, out, _ = invoke(cli, "connect", "codex", "--model", "tiny", "--write")
    text = config.read_text()
    parsed = tomlkit.parse(text).unwrap()
    assert code == 0 and out.splitlines()[0] == (
        f"wrote {config}: model, model_provider, [model_providers.sm120]"
    )
    assert text.startswith("# mine\n")
    assert parsed["approval_policy"] == "on-request" and parsed["model_providers"]["other"]
    assert (parsed["model"], parsed["model_provider"]) == ("tiny", "sm120")
    assert parsed["model_providers"]["sm120"] == {
        "name": "sm120 (the gateway)",
        "base_url": f"{gateway['root']}/v1",
        "env_key": "SM120_API_KEY",
        "wire_api": "responses",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("openai", "--model", "tiny", "--write"),
            "Error: the openai client has no config file of its own (hint: use the environment "
            'instead: eval "$(sm120 connect openai --shell)")',
        ),
        (
            ("cursor",),
            "Error: unknown client 'cursor' (hint: choose one of claude-code, codex, openai)",
        ),
        (
            ("codex",),
            "Error: the gateway serves 0 models (none): choose one (hint: name the deployment "
            "(sm120 connect CLIENT NAME) or pass --model)",
        ),
        (
            ("codex", "glm52"),
            "Error: the gateway serves no deployment named 'glm52'; deployments: none "
            "(hint: sm120 status lists them)",
        ),
        (
            ("codex", "--shell", "--write"),
            "Error: --shell and --write do not go together (hint: choose one)",
        ),
    ],
)
def test_bad_connect_requests_are_one_line(
    cli: CliRunner, gateway: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    code, out, err = invoke(cli, "connect", *args)
    assert (code, out, one_line_error(err)) == (2, "", message)


def test_without_gateway_or_deployment_there_is_nothing_to_connect_to(
    cli: CliRunner, isolated_home: Path
) -> None:
    code, _, err = invoke(cli, "connect", "claude-code")
    assert one_line_error(err) == (
        "Error: 0 deployments run (none) and no gateway: name one, or start the gateway "
        "(hint: sm120 connect CLIENT NAME, or sm120 gateway start)"
    )
    assert code == 2


def test_a_config_that_is_not_ours_to_parse_is_left_as_it_was(tmp_path: Path) -> None:
    endpoint = Endpoint("http://127.0.0.1:1", tmp_path / "key", ("m",), "the gateway")
    settings = settings_for("claude-code", endpoint, None)
    target = tmp_path / ".claude" / "settings.json"
    target.parent.mkdir()
    target.write_text("{not json")
    with pytest.raises(Exception, match=r"is not JSON .*nothing was written"):
        write_client_config(settings, tmp_path)
    assert target.read_text() == "{not json"
    target.unlink()
    target.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(Exception, match="is not a regular file"):
        write_client_config(settings, tmp_path)
    assert not (tmp_path / "elsewhere.json").exists()


def test_claude_code_is_told_the_window_and_warned_of_missing_auto_tool_choice(
    tmp_path: Path,
) -> None:
    from sm120.gateway.connect import warnings_for
    from tests.fakes.gateway import backend

    served = backend("tiny", "http://127.0.0.1:1", max_model_len=4096, auto_tool_choice=False)
    endpoint = Endpoint("http://127.0.0.1:1", tmp_path / "key", ("tiny",), "the gateway", (served,))
    settings = settings_for("claude-code", endpoint, None)
    assert settings.env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "4096"
    assert settings.env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert warnings_for(settings) == [
        "deployment dep-tiny runs without --enable-auto-tool-choice: claude-code's tool "
        "requests ('tool_choice: auto') get a 400 from vLLM; relaunch with --set "
        "enable-auto-tool-choice=true --set tool-call-parser=PARSER (the recipe's parser, "
        "e.g. glm47 for GLM, hermes for the tiny model)"
    ]
    ready = backend("tiny", "http://127.0.0.1:1", auto_tool_choice=True)
    endpoint = Endpoint("http://127.0.0.1:1", tmp_path / "key", ("tiny",), "the gateway", (ready,))
    assert warnings_for(settings_for("claude-code", endpoint, None)) == []
