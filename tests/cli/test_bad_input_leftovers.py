"""Issue #49's leftovers: a deployment folder linked out of the state tree, a home that is a
file, key files that hold no key, ssh options and build arguments from every request. Each
case asserts the exact one line (or, where a command goes on, the exact row)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import invoke, one_line_error

# --- a deployment folder linked out of the state tree ---------------------------------------


def _linked_and_healthy(home: Path, outside: Path) -> Path:
    """`good` a stopped deployment of the tree's own, `demo` a link to `outside`, whose state
    file is not even JSON: a reader that followed the link would fail on it."""
    from tests.deploy.test_stop_safety import state_document

    good = home / "deployments" / "good"
    good.mkdir(parents=True)
    document = state_document(good, name="good", supervisor_pid=4_194_303)
    (good / "state.json").write_text(json.dumps(document))
    outside.mkdir()
    (outside / "state.json").write_text("{not json")
    (outside / "api_key").write_bytes(b"\xff")
    link = home / "deployments" / "demo"
    link.symlink_to(outside)
    return link


def _link_line(link: Path, outside: Path, home: Path) -> str:
    return (
        f"{link} is a link to {outside}, outside sm120's state folder {home} "
        f"(hint: remove the link (rm {link}); sm120 makes its own folders there)"
    )


def test_status_names_a_linked_folder_and_shows_the_rest(
    cli: CliRunner, isolated_home: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    link = _linked_and_healthy(isolated_home, outside)
    code, out, err = invoke(cli, "status")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("good  (tiny, native runtime")
    assert lines[-2:] == [
        "demo  (not read)",
        f"  skipped   {_link_line(link, outside, isolated_home)}",
    ]
    code, out, _ = invoke(cli, "status", "--json")
    rows = json.loads(out)
    assert [row["name"] for row in rows] == ["good", "demo"]
    assert rows[1] == {"name": "demo", "skipped": _link_line(link, outside, isolated_home)}


@pytest.mark.parametrize(
    "args",
    [("stop", "demo"), ("logs", "--name", "demo"), ("status", "demo"),
     ("monitor", "--name", "demo"), ("chat", "--name", "demo", "hi"), ("logs",), ("stop",)],
)  # fmt: skip
def test_commands_on_a_linked_folder_refuse_in_one_line(
    cli: CliRunner, isolated_home: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    outside = tmp_path / "outside"
    link = _linked_and_healthy(isolated_home, outside)
    code, out, err = invoke(cli, *args)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: {_link_line(link, outside, isolated_home)}",
    )
    assert sorted(p.name for p in outside.iterdir()) == ["api_key", "state.json"]


def test_the_gateway_and_the_dashboard_name_a_linked_folder(
    isolated_home: Path, tmp_path: Path
) -> None:
    from sm120.dashboard.snapshot import snapshot
    from sm120.gateway.backends import discover

    outside = tmp_path / "outside"
    link = _linked_and_healthy(isolated_home, outside)
    skipped: dict[str, str] = {}
    discover(skipped)
    assert skipped == {"demo": f"StateError: {_link_line(link, outside, isolated_home)}"[:200]}
    shown = snapshot({}, None, lambda state: {"name": state.name})
    rows = {row["name"]: row for row in shown["deployments"]}
    assert rows["demo"]["phase"] == "unreadable"
    assert rows["demo"]["error"] == _link_line(link, outside, isolated_home)


# --- a home that is a file ------------------------------------------------------------------

_HOME_HINT = "(hint: point SM120_HOME at a folder (or unset it for ~/.local/state/sm120))"


@pytest.mark.parametrize(
    "args",
    [("status",), ("status", "--json"), ("logs",), ("logs", "--gateway"), ("stop", "demo"),
     ("stop",), ("gateway", "status"), ("gateway", "stop"), ("gateway", "keys", "list"),
     ("gateway", "start", "--port", "1"), ("gateway", "analyze"), ("dashboard", "--port", "1"),
     ("connect", "codex"), ("monitor", "--once"), ("launch", "tiny", "--dry-run")],
)  # fmt: skip
def test_a_home_that_is_a_file_is_refused_by_every_command(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    home = tmp_path / "home-file"
    home.write_text("")
    monkeypatch.setenv("SM120_HOME", str(home))
    code, out, err = invoke(cli, *args)
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: SM120_HOME {home} is a file, not a folder {_HOME_HINT}",
    )
    assert home.read_text() == ""


def test_the_default_home_that_is_a_file_is_refused_too(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SM120_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "sm120").write_text("")
    code, out, err = invoke(cli, "status")
    assert (code, out, one_line_error(err)) == (
        2,
        "",
        f"Error: sm120's state folder {tmp_path / 'sm120'} is a file, not a folder "
        f"(hint: move the file {tmp_path / 'sm120'} aside; sm120 makes its folder there)",
    )
