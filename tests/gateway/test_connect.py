"""`sm120 connect`: what each client is told, eval'd and written (checked against each
client's published schema), backed up and undone, against a real detached gateway process (no
engine), and every refusal in one line. Claude Code and Codex themselves, reading these files
and talking through the gateway, are in tests/integration/test_agent_clients.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomlkit
from typer.testing import CliRunner

from sm120.gateway import connect as connect_module
from sm120.gateway.aliases import Alias
from sm120.gateway.backends import Backend
from sm120.gateway.connect import (
    Endpoint,
    settings_for,
    stale_writes,
    warnings_for,
    write_client_config,
)
from sm120.gateway.connect_files import ConnectError, undo
from sm120.gateway.control import stop_gateway
from sm120.gateway.files import gateway_files
from tests.fakes.gateway import backend
from tests.helpers import free_port, invoke, one_line_error

SCHEMAS = Path(__file__).parents[1] / "data" / "client_schemas"


def _schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMAS / name).read_text())
    return loaded


@pytest.fixture
def gateway(
    cli: CliRunner, isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """A running gateway (no deployments behind it) and a HOME of the test's own."""
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    port = free_port()
    code, _, err = invoke(cli, "gateway", "start", "--port", str(port), "--alias", "fast=dep-big")
    assert code == 0, err
    files = gateway_files()
    yield {"root": f"http://127.0.0.1:{port}", "key": files.api_key.read_text().strip(),
           "key_file": str(files.api_key)}  # fmt: skip
    stop_gateway(files)


@pytest.fixture
def deployed(monkeypatch: pytest.MonkeyPatch, gateway: dict[str, str]) -> dict[str, Backend]:
    """What `discover` finds behind the gateway: one running agent-sized deployment, one
    small one, and one stopped (still startable)."""
    table = {
        "big": backend("big", "http://127.0.0.1:1", max_model_len=32768, auto_tool_choice=True),
        "small": backend("small", "http://127.0.0.1:2", max_model_len=1024),
        "old": backend("old", "http://127.0.0.1:3", running=False, max_model_len=32768),
    }
    monkeypatch.setattr(connect_module, "discover", lambda: table)
    return table


def _home() -> Path:
    return Path(os.environ["HOME"])


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
    assert "  CLAUDE_CODE_MAX_RETRIES=2" in out.splitlines()
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


def test_a_state_path_with_a_command_in_it_is_never_run(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    """What connect prints to eval (and its `then:` line) quotes the key's path."""
    home = tmp_path / "$(touch PWNED)"
    monkeypatch.setenv("SM120_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    port = free_port()
    assert invoke(cli, "gateway", "start", "--port", str(port))[0] == 0
    try:
        _, out, _ = invoke(cli, "connect", "openai", "--model", "tiny", "--shell")
        subprocess.run(["sh", "-c", out], cwd=tmp_path, check=True)
        _, out, _ = invoke(cli, "connect", "codex", "--model", "tiny", "--write")
        then = next(line for line in out.splitlines() if line.startswith("then: "))
        assert then == "then: codex -p sm120"
    finally:
        stop_gateway(gateway_files())
    assert not (tmp_path / "PWNED").exists()


def test_write_merges_claude_settings_backs_them_up_and_undo_restores_them(
    cli: CliRunner, gateway: dict[str, str]
) -> None:
    settings = _home() / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True, mode=0o755)
    settings.parent.chmod(0o755)
    original = json.dumps(
        {"permissions": {"allow": ["Bash(ls)"]},
         "env": {"ANTHROPIC_API_KEY": "old", "ANTHROPIC_MODEL": "claude-opus-4-1"}}
    )  # fmt: skip
    settings.write_text(original)
    code, out, _ = invoke(cli, "connect", "claude-code", "--model", "tiny", "--write")
    written = json.loads(settings.read_text())
    assert code == 0 and out.startswith(f"wrote {settings}: ANTHROPIC_BASE_URL, ")
    assert out.splitlines()[0].endswith(
        "apiKeyHelper, ANTHROPIC_API_KEY (removed), replaced ANTHROPIC_MODEL (was "
        "'claude-opus-4-1')"
    )
    assert out.splitlines()[1] == "undo: sm120 connect claude-code --undo"
    jsonschema.validate(written, _schema("claude_code_settings.subset.json"))
    assert written["permissions"] == {"allow": ["Bash(ls)"]}
    assert "ANTHROPIC_API_KEY" not in written["env"]
    assert written["env"]["ANTHROPIC_BASE_URL"] == gateway["root"]
    assert gateway["key"] not in settings.read_text()
    helper = subprocess.run(
        ["/bin/sh", "-c", written["apiKeyHelper"]], capture_output=True, text=True
    )
    assert helper.stdout.strip() == gateway["key"]
    assert oct(settings.stat().st_mode & 0o777) == "0o600"
    assert oct(settings.parent.stat().st_mode & 0o777) == "0o700"
    # A second write keeps the first backup: undo returns to the user's own file.
    assert invoke(cli, "connect", "claude-code", "--model", "fast", "--write")[0] == 0
    code, out, _ = invoke(cli, "connect", "claude-code", "--undo")
    assert (code, out) == (0, f"restored {settings} as it was before sm120 wrote it\n")
    assert settings.read_text() == original
    code, _, err = invoke(cli, "connect", "claude-code", "--undo")
    assert (code, one_line_error(err)) == (
        2,
        "Error: sm120 has written no claude-code files (or they were restored already) "
        "(hint: sm120 connect claude-code --write writes them)",
    )


def test_undo_leaves_a_file_the_user_changed_since_and_removes_one_sm120_created(
    cli: CliRunner, gateway: dict[str, str]
) -> None:
    settings = _home() / ".claude" / "settings.json"
    assert invoke(cli, "connect", "claude-code", "--model", "tiny", "--write")[0] == 0
    settings.write_text(settings.read_text().replace("tiny", "mine"))
    code, _, err = invoke(cli, "connect", "claude-code", "--undo")
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {settings} changed since sm120 wrote it; nothing was restored (hint: merge "
        "by hand, or delete the file and rerun --undo)",
    )
    assert "mine" in settings.read_text()
    assert invoke(cli, "connect", "claude-code", "--model", "tiny", "--write")[0] == 0
    assert undo("claude-code") == [f"removed {settings} (sm120 had created it)"]
    assert not settings.exists()


def test_codex_gets_a_profile_of_its_own_and_the_users_config_is_untouched(
    cli: CliRunner, deployed: dict[str, Backend], gateway: dict[str, str]
) -> None:
    mine = _home() / ".codex" / "config.toml"
    mine.parent.mkdir(parents=True)
    mine.write_text('model = "gpt-6"\nmodel_provider = "openai"\n')
    code, out, _ = invoke(cli, "connect", "codex", "--model", "fast", "--write")
    profile = _home() / ".codex" / "sm120.config.toml"
    assert code == 0 and out.splitlines() == [
        f"wrote {profile}: model, model_provider, model_context_window, "
        "[model_providers.sm120-local]",
        "undo: sm120 connect codex --undo",
        "then: codex -p sm120",
    ]
    assert mine.read_text() == 'model = "gpt-6"\nmodel_provider = "openai"\n'
    parsed = tomlkit.parse(profile.read_text()).unwrap()
    jsonschema.validate(parsed, _schema("codex_config.subset.json"))
    # The alias the user asked for in the model slot, the window of what it reaches.
    assert (parsed["model"], parsed["model_context_window"]) == ("fast", 32768)
    assert parsed["model_providers"]["sm120-local"] == {
        "name": "sm120 (the gateway)",
        "base_url": f"{gateway['root']}/v1",
        "wire_api": "responses",
        "request_max_retries": 1,
        "stream_max_retries": 1,
        "stream_idle_timeout_ms": 1_800_000,
        "auth": {"command": "cat", "args": [gateway["key_file"]]},
    }
    # The key is found by a command, in a shell that exported nothing.
    auth = parsed["model_providers"]["sm120-local"]["auth"]
    found = subprocess.run([auth["command"], *auth["args"]], env={}, capture_output=True)
    assert found.stdout.decode().strip() == gateway["key"]
    assert gateway["key"] not in profile.read_text()
    assert undo("codex") == [f"removed {profile} (sm120 had created it)"]


def test_an_alias_keeps_the_window_and_the_tool_choice_warning(
    cli: CliRunner, deployed: dict[str, Backend], gateway: dict[str, str]
) -> None:
    deployed["big"] = backend(
        "big", "http://127.0.0.1:1", max_model_len=32768, auto_tool_choice=False
    )
    code, _, err = invoke(cli, "connect", "claude-code", "--model", "fast", "--write")
    env = json.loads((_home() / ".claude" / "settings.json").read_text())["env"]
    assert code == 0
    slots = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
             "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL")  # fmt: skip
    assert {env[slot] for slot in slots} == {"fast"}
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env  # read as >= 100k: left out
    assert err.startswith("warning: deployment dep-big runs without --enable-auto-tool-choice")


def test_only_running_deployments_are_offered(cli: CliRunner, deployed: dict[str, Backend]) -> None:
    code, _, err = invoke(cli, "connect", "codex")
    assert (code, one_line_error(err)) == (
        2,
        "Error: the gateway serves 2 running models (big, small): choose one (hint: name the "
        "deployment (sm120 connect CLIENT NAME) or pass --model)",
    )
    del deployed["small"]
    code, out, _ = invoke(cli, "connect", "codex")
    assert code == 0 and "(model big)" in out.splitlines()[0]
    # A stopped one is still reachable by its name: the gateway starts it when asked.
    code, out, _ = invoke(cli, "connect", "codex", "dep-old")
    assert code == 0 and "(model old)" in out.splitlines()[0]


def test_a_context_too_small_for_the_clients_own_prompt_is_refused_up_front(
    cli: CliRunner, deployed: dict[str, Backend]
) -> None:
    code, out, err = invoke(cli, "connect", "claude-code", "dep-small", "--write")
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        "Error: deployment dep-small holds 1,024 tokens; claude-code's own prompt is ~16,000 "
        "(with a reply: 17,024) (hint: relaunch it with a larger context: sm120 launch RECIPE "
        "--set max-model-len=32768 (tiny: sm120 launch tiny -V agent), then rerun sm120 "
        "connect)",
    )
    assert not (_home() / ".claude").exists()
    code, _, err = invoke(cli, "connect", "codex", "dep-small")
    assert code == 2 and "codex's own prompt is ~12,000" in err


def test_a_relaunch_with_another_context_is_noticed(
    cli: CliRunner, deployed: dict[str, Backend]
) -> None:
    assert invoke(cli, "connect", "claude-code", "dep-big", "--write")[0] == 0
    assert stale_writes(deployed) == []
    deployed["big"] = backend("big", "http://127.0.0.1:1", max_model_len=65536)
    settings = _home() / ".claude" / "settings.json"
    assert stale_writes(deployed) == [
        f"{settings} was written for dep-big's 32,768-token context; it now has 65,536-token: "
        "rerun sm120 connect claude-code --write"
    ]
    code, _, err = invoke(cli, "connect", "claude-code", "dep-big")
    assert code == 0 and err.startswith(f"stale: {settings} was written for dep-big's")


def test_show_key_shows_the_key_with_write_too(cli: CliRunner, gateway: dict[str, str]) -> None:
    code, out, _ = invoke(cli, "connect", "codex", "--model", "tiny", "--write", "--show-key")
    assert code == 0 and out.splitlines()[-1] == f"key: {gateway['key']}"


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
            ("cursor", "--undo"),
            "Error: unknown client 'cursor' (hint: choose one of claude-code, codex, openai)",
        ),
        (
            ("codex",),
            "Error: the gateway serves 0 running models (none): choose one (hint: name the "
            "deployment (sm120 connect CLIENT NAME) or pass --model)",
        ),
        (
            ("codex", "glm52"),
            "Error: the gateway serves no deployment named 'glm52'; deployments: none "
            "(hint: sm120 status lists them)",
        ),
        (
            ("codex", "--shell", "--write"),
            "Error: --shell, --write and --undo do not go together (hint: choose one)",
        ),
        (
            ("codex", "--write", "--undo"),
            "Error: --shell, --write and --undo do not go together (hint: choose one)",
        ),
        (
            ("codex", "--model", "tiny\nmodel_provider = 'evil'", "--write"),
            "Error: model name \"tiny\\nmodel_provider = 'evil'\" is not a model name (hint: "
            "letters, digits and . _ : / @ + = - (up to 200), e.g. --model tiny)",
        ),
    ],
)
def test_bad_connect_requests_are_one_line(
    cli: CliRunner, gateway: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    code, out, err = invoke(cli, "connect", *args)
    assert (code, out, one_line_error(err)) == (2, "", message)
    assert not (_home() / ".codex").exists()


def test_without_gateway_or_deployment_there_is_nothing_to_connect_to(
    cli: CliRunner, isolated_home: Path
) -> None:
    code, _, err = invoke(cli, "connect", "claude-code")
    assert one_line_error(err) == (
        "Error: 0 deployments run (none) and no gateway: name one, or start the gateway "
        "(hint: sm120 connect CLIENT NAME, or sm120 gateway start)"
    )
    assert code == 2


def _claude_settings(tmp_path: Path, model: str = "m") -> Any:
    endpoint = Endpoint("http://127.0.0.1:1", tmp_path / "key", (model,), "the gateway")
    return settings_for("claude-code", endpoint, None)


def test_a_config_that_is_not_ours_to_parse_is_left_as_it_was(
    tmp_path: Path, isolated_home: Path
) -> None:
    settings = _claude_settings(tmp_path)
    target = tmp_path / ".claude" / "settings.json"
    target.parent.mkdir()
    for text, reason in [
        ("{not json", "Expecting property name enclosed in double quotes"),
        ('{"cleanupPeriodDays": NaN}', "NaN is not a JSON number"),
        ("[" * 100_000, "maximum recursion depth exceeded"),
    ]:
        target.write_text(text)
        with pytest.raises(ConnectError) as refused:
            write_client_config(settings, tmp_path)
        assert refused.value.message.startswith(f"{target} is not JSON ({reason}")
        assert refused.value.message.endswith("; nothing was written")
        assert target.read_text() == text
    target.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ConnectError, match="is not UTF-8 text; nothing was written"):
        write_client_config(settings, tmp_path)
    target.unlink()
    target.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ConnectError, match="is not a regular file"):
        write_client_config(settings, tmp_path)
    assert not (tmp_path / "elsewhere.json").exists()


def test_a_claude_folder_that_is_a_link_is_not_written_through(
    tmp_path: Path, isolated_home: Path
) -> None:
    real = tmp_path / "dotfiles"
    real.mkdir()
    (tmp_path / ".claude").symlink_to(real)
    with pytest.raises(ConnectError) as refused:
        write_client_config(_claude_settings(tmp_path), tmp_path)
    assert refused.value.one_line() == (
        f"{tmp_path / '.claude'} is a link; sm120 writes no client files through links "
        "(hint: replace the link with the folder it points to, then retry)"
    )
    assert list(real.iterdir()) == []


def test_a_file_name_too_long_is_one_line(tmp_path: Path, isolated_home: Path) -> None:
    home = tmp_path / ("x" * 300)
    with pytest.raises(ConnectError) as refused:
        write_client_config(_claude_settings(tmp_path), home)
    assert refused.value.one_line() == (
        f"cannot create {home / '.claude'}: File name too long (hint: move it aside and retry)"
    )


def test_claude_code_is_told_the_window_and_warned_of_missing_auto_tool_choice(
    tmp_path: Path,
) -> None:
    served = backend("tiny", "http://127.0.0.1:1", max_model_len=200_000, auto_tool_choice=False)
    endpoint = Endpoint("http://127.0.0.1:1", tmp_path / "key", ("tiny",), "the gateway", (served,))
    settings = settings_for("claude-code", endpoint, None)
    assert settings.env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "200000"
    assert settings.env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "200000"
    assert settings.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "32000"
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


def test_a_claude_name_claude_code_knows_is_warned_of_on_a_small_window(tmp_path: Path) -> None:
    served = backend("tiny", "http://127.0.0.1:1", max_model_len=32768, auto_tool_choice=True)
    endpoint = Endpoint(
        "http://127.0.0.1:1", tmp_path / "key", ("tiny",), "the gateway", (served,),
        (Alias("claude-*", "dep-tiny"),),
    )  # fmt: skip
    settings = settings_for("claude-code", endpoint, "claude-sonnet-4-5")
    assert settings.served == served
    assert warnings_for(settings) == [
        "Claude Code knows the name 'claude-sonnet-4-5' and assumes its own context window "
        "for it, not the 32,768 tokens deployment dep-tiny holds: pass --model tiny so it "
        "compacts in time"
    ]
