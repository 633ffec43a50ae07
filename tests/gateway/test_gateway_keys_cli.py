"""`sm120 gateway keys|usage|analyze`: what they print, and every bad input's one-line error."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from sm120.gateway.files import gateway_files
from sm120.gateway.keys import KeyRing, KeyStore
from sm120.gateway.usage import Record, connect, insert
from tests.helpers import invoke, one_line_error


def test_keys_add_prints_the_key_once_and_list_never_shows_it(
    cli: CliRunner, isolated_home: Path
) -> None:
    code, out, err = invoke(
        cli, "gateway", "keys", "add", "ann", "--models", "tiny-*, glm47", "--rpm", "30",
        "--concurrency", "2", "--expires", "2099-12-31",
    )  # fmt: skip
    assert code == 0, err
    key = out.strip()
    assert key.startswith("sm120-") and len(key) > 40
    assert err.strip() == "added key 'ann' (shown once: hand it over now)"
    code, listed, _ = invoke(cli, "gateway", "keys", "list")
    assert code == 0
    assert listed.strip() == (
        "ann                  tiny-*,glm47; limits: rpm 30, concurrency 2, expires after 2099-12-31"
    )
    _, as_json, _ = invoke(cli, "gateway", "keys", "list", "--json")
    (row,) = json.loads(as_json)
    assert (row["name"], row["models"], row["rpm"]) == ("ann", "tiny-*,glm47", 30)
    stored = (gateway_files().root / "keys.json").read_text()
    assert key not in stored and key not in listed and key not in as_json
    ring = KeyRing("admin-key", KeyStore(gateway_files().root))
    entry = ring.lookup(key.encode())
    assert entry is not None and entry.allows("tiny-a") and not entry.allows("other")


def test_rotate_prints_a_new_key_and_revoke_removes_it(cli: CliRunner, isolated_home: Path) -> None:
    _, first, _ = invoke(cli, "gateway", "keys", "add", "bob")
    code, second, err = invoke(cli, "gateway", "keys", "rotate", "bob")
    assert code == 0 and second.strip() != first.strip()
    assert "the old key no longer works" in err
    ring = KeyRing("admin-key", KeyStore(gateway_files().root))
    assert ring.lookup(first.strip().encode()) is None
    assert ring.lookup(second.strip().encode()) is not None
    code, out, _ = invoke(cli, "gateway", "keys", "revoke", "bob")
    assert (code, out.strip()) == (0, "revoked key 'bob'")
    _, listed, _ = invoke(cli, "gateway", "keys", "list")
    assert listed.strip() == "no keys but the gateway's own (add one: sm120 gateway keys add NAME)"


def test_every_bad_keys_input_is_one_line_with_a_hint(cli: CliRunner, isolated_home: Path) -> None:
    invoke(cli, "gateway", "keys", "add", "ann")
    cases = {
        ("add", "ann"): "Error: a key named 'ann' exists (hint: 'sm120 gateway keys rotate ann')",
        ("add", "admin"): "Error: 'admin' is not a key name (hint: use letters, digits and . _ @ "
        "- (up to 64, starting with a letter or digit; 'admin' is the gateway's own key))",
        ("add", "x", "--rpm", "0"): "Error: --rpm must be 1 or more, got 0 (hint: requests per "
        "minute, e.g. --rpm 60)",
        ("add", "x", "--expires", "2001-01-01"): "Error: --expires 2001-01-01 is in the past "
        "(hint: give a day from today on)",
        ("add", "x", "--expires", "tomorrow"): "Error: --expires 'tomorrow' is not a date (hint: "
        "write it as YYYY-MM-DD)",
        ("add", "x", "--models", "a,,b"): "Error: --models 'a,,b' has an empty or unprintable "
        "pattern (hint: give comma-separated model names or patterns, e.g. 'tiny-*,glm47')",
        ("revoke", "nobody"): "Error: no key named 'nobody' (hint: see 'sm120 gateway keys list')",
        ("rotate", "nobody"): "Error: no key named 'nobody' (hint: see 'sm120 gateway keys list')",
    }  # fmt: skip
    for args, message in cases.items():
        code, _, err = invoke(cli, "gateway", "keys", *args)
        assert code != 0, args
        assert one_line_error(err) == message, args


def test_usage_groups_by_key_model_and_day(cli: CliRunner, isolated_home: Path) -> None:
    path = gateway_files().usage_db
    db = connect(path, create=True)
    now = time.time()
    insert(db, [
        Record("ann", "tiny-a", "chat", 200, 0.0, at=now, prompt_tokens=10, cached_tokens=4,
               completion_tokens=3, ttft_ms=20.0),
        Record("ann", "tiny-b", "messages", 429, 0.0, at=now),
        Record("bob\x1b]0;pwned\x07", "tiny-a", "chat", 200, 0.0, at=now - 3 * 86400,
               prompt_tokens=5, completion_tokens=1, ttft_ms=40.0),
    ])  # fmt: skip
    db.close()
    code, out, _ = invoke(cli, "gateway", "usage", "--by", "key", "--json")
    assert code == 0
    rows = {row["key"]: row for row in json.loads(out)}
    assert rows["ann"]["requests"] == 2 and rows["ann"]["errors"] == 1
    assert (rows["ann"]["prompt_tokens"], rows["ann"]["cached_tokens"]) == (10, 4)
    _, table, _ = invoke(cli, "gateway", "usage", "--by", "model")
    assert table.splitlines()[1].split() == ["tiny-a", "2", "0", "15", "4", "4", "30"]
    _, recent, _ = invoke(cli, "gateway", "usage", "--since", "1d")
    assert "bob" not in recent and "\x1b" not in recent
    _, everyone, _ = invoke(cli, "gateway", "usage")
    # The title-setting sequence is dropped whole: the name shows, the terminal is untouched.
    assert everyone.splitlines()[2].split()[0] == "bob"
    assert "\x1b" not in everyone and "\x07" not in everyone


def test_bad_usage_and_analyze_inputs_are_one_line(cli: CliRunner, isolated_home: Path) -> None:
    files = gateway_files()
    cases = {
        ("usage",): f"Error: no usage recorded yet ({files.usage_db} does not exist) (hint: the "
        "gateway records usage once it has served a request (sm120 gateway start))",
        ("usage", "--by", "colour"): "Error: --by 'colour' is not a grouping (hint: use one of "
        "key, model, day, protocol)",
        ("usage", "--since", "soon"): "Error: --since 'soon' is neither a day nor a time ago "
        "(hint: write YYYY-MM-DD, or 30m, 12h, 7d)",
        ("analyze",): f"Error: no request log at {files.request_log} (hint: start the gateway "
        "with --request-log and let a session run (sm120 gateway start))",
    }  # fmt: skip
    for args, message in cases.items():
        code, _, err = invoke(cli, "gateway", *args)
        assert code != 0, args
        assert one_line_error(err) == message, args
