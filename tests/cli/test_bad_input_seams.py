"""Bad input at the seams the third hardening round found (issue #49): recipe values a dry
run used to accept, the KV tier's sizes and paths, alias files, NaN from an engine, a home
or deployment folder that is not what it claims. Each case asserts the exact one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import invoke, one_line_error

_SET_HINT = "(hint: check the --set / .env value)"
_AT_LEAST = "Input should be greater than or equal to 0.125"
_LMCACHE = ("kv_tier.backend=lmcache", "kv_tier.cpu_gib=8", "kv_tier.disk_gib=10")


def _dry_run(cli: CliRunner, *sets: str, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    args = ["launch", "tiny", "--dry-run", *extra]
    for assignment in sets:
        args += ["--set", assignment]
    code, _, err = invoke(cli, *args)
    return code, one_line_error(err)


# --- recipe values a dry run accepted -----------------------------------------------------------


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("image.tag=x;id", "image.tag: image tag 'x;id' is not a tag: up to 128 letters, digits, "
         "'_', '.' or '-', not starting with '.' or '-'"),
        ("image.tag=-rf", "image.tag: image tag '-rf' is not a tag: up to 128 letters, digits, "
         "'_', '.' or '-', not starting with '.' or '-'"),
        ("image.name=../../x", "image.name: image name '../../x' is not an image reference: "
         "lowercase [registry/]path/name, e.g. vllm/vllm-openai"),
        ("image.name=Vllm/X", "image.name: image name 'Vllm/X' is not an image reference: "
         "lowercase [registry/]path/name, e.g. vllm/vllm-openai"),
    ],
)  # fmt: skip
def test_image_references_are_references(cli: CliRunner, assignment: str, message: str) -> None:
    assert _dry_run(cli, assignment) == (2, f"Error: {message} {_SET_HINT}")


def test_a_registry_with_a_port_is_still_an_image_name(cli: CliRunner) -> None:
    code, _, err = invoke(
        cli, "launch", "tiny", "--dry-run", "--set", "image.name=registry.local:5000/team/vllm"
    )
    assert "image name" not in err and code in (0, 1)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("A=x\ny", "--build-arg A's value holds a control character (a newline, tab or NUL)"),
        ("A B=x", "--build-arg 'A B' is not a build argument name (letters, digits, '_')"),
        ("noequals", "--build-arg expects KEY=VALUE, got 'noequals'"),
    ],
)
def test_build_args_are_one_line_each(cli: CliRunner, arg: str, message: str) -> None:
    code, _, err = invoke(cli, "build", "tiny", "--dry-run", "--build-arg", arg)
    assert (code, one_line_error(err)) == (
        2,
        f"Error: {message} (hint: e.g. --build-arg TORCH_INDEX_URL=)",
    )


@pytest.mark.parametrize("option", ["IdentityFile", "=x", "Identity File=x", "A=b\nc", "A="])
def test_ssh_options_are_keyword_equals_value(cli: CliRunner, option: str) -> None:
    code, message = _dry_run(cli, extra=("--nodes", "a,b", "--ssh-option", option))
    assert (code, message) == (
        2,
        f"Error: --ssh-option {option!r} is not Keyword=value (hint: write Keyword=value, "
        "e.g. --ssh-option IdentityFile=~/.ssh/k)",
    )


def test_a_parallel_size_of_zero_is_a_failed_rule_not_a_division(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "launch", "glm52", "--dry-run", "--set", "tensor-parallel-size=0")
    assert code == 1 and "ZeroDivisionError" not in err + out
    assert "FAIL   S04 tensor-parallel-size must be at least 1, got 0" in out
    assert "roofline   unknown: a parallel size below 1 (tensor 0, decode context 1)" in out


# --- the KV tier ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("kv_tier.cpu_gib=1e-300", f"kv_tier.cpu_gib: {_AT_LEAST}"),
        ("kv_tier.cpu_gib=0.01", f"kv_tier.cpu_gib: {_AT_LEAST}"),
        ("kv_tier.cpu_gib=true", "kv_tier.cpu_gib: a size in GiB, not true"),
        ("kv_tier.cpu_gib=false", "kv_tier.cpu_gib: a size in GiB, not false"),
    ],
)  # fmt: skip
def test_kv_tier_sizes_are_sizes(cli: CliRunner, assignment: str, message: str) -> None:
    assert _dry_run(cli, assignment) == (2, f"Error: {message} {_SET_HINT}")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/data:/etc", "kv_tier.disk_path: disk_path '/data:/etc' holds ':', which a container "
         "mount reads as a separator"),
        ("/" + "a" * 5000, "kv_tier.disk_path: disk_path is 5,001 characters long; a path has "
         "at most 4096"),
        ("/data/" + "b" * 300, "kv_tier.disk_path: disk_path has a folder name longer than 255 "
         "bytes"),
    ],
    ids=["colon", "5000-chars", "long-name"],
)  # fmt: skip
def test_kv_tier_disk_paths_a_mount_can_hold(cli: CliRunner, path: str, message: str) -> None:
    assert _dry_run(cli, *_LMCACHE, f"kv_tier.disk_path={path}") == (
        2,
        f"Error: {message} {_SET_HINT}",
    )


def test_a_host_path_with_a_control_character_is_refused() -> None:
    from sm120.recipe.schema import check_host_path

    # --set folds a newline into a space (YAML); a recipe file can hold one in quotes.
    with pytest.raises(ValueError, match=r"^disk_path holds a control character \(a newline"):
        check_host_path("/data\n/x", "disk_path")


def test_a_bind_source_with_a_colon_is_written_in_compose_long_form() -> None:
    import yaml

    from sm120.render.compose import _bind

    # Nothing in a plan holds one any more (the schema refuses it); the renderer still never
    # writes a short form that a colon would split.
    assert _bind("/models/x", "/model", read_only=True) == "/models/x:/model:ro"
    long = _bind("/data:/etc", "/data:/etc")
    assert long == {"type": "bind", "source": "/data:/etc", "target": "/data:/etc"}
    assert yaml.safe_load(yaml.safe_dump({"volumes": [long]}))["volumes"][0]["source"] == (
        "/data:/etc"
    )


@pytest.mark.parametrize("kind", ["file", "device"])
def test_a_disk_tier_at_a_file_or_device_says_what_is_there(tmp_path: Path, kind: str) -> None:
    from types import SimpleNamespace

    from sm120.doctor.kv_tier_checks import check_kv_tier_disk
    from sm120.doctor.needs import Needs

    target = "/dev/null"
    if kind == "file":
        target = str(tmp_path / "a-file")
        Path(target).write_text("x")
    needs = Needs(kv_tier_disk_path=target, kv_tier_disk_gib=10)
    [finding] = check_kv_tier_disk(needs, lambda path: SimpleNamespace(free=0))
    shown = "a regular file" if kind == "file" else "a device"
    assert (finding.severity, finding.message, finding.remediation) == (
        "error",
        f"the KV tier's disk folder {target} is {shown}, not a folder",
        "set kv_tier.disk_path to a folder on a local NVMe disk (a file system, not a device)",
    )


def test_a_disk_tier_path_the_kernel_refuses_is_one_finding() -> None:
    from types import SimpleNamespace

    from sm120.doctor.kv_tier_checks import check_kv_tier_disk
    from sm120.doctor.needs import Needs

    needs = Needs(kv_tier_disk_path="/" + "a" * 5000, kv_tier_disk_gib=10)
    [finding] = check_kv_tier_disk(needs, lambda path: SimpleNamespace(free=0))
    assert finding.severity == "error"
    assert finding.message == (
        f"the KV tier's disk folder /{'a' * 99}... cannot be used: File name too long"
    )


# --- alias files ----------------------------------------------------------------------------------

_FILE_HINT = "(hint: write a YAML mapping: aliases: {claude-sonnet-4-5: glm52})"


def _alias_error(cli: CliRunner, tmp_path: Path, text: str) -> tuple[int, str, Path]:
    """What reading the file says (the same line `gateway start --aliases` prints, without a
    gateway that a file read wrongly as good would start)."""
    from sm120.gateway.aliases import AliasError, load_alias_file

    path = tmp_path / "aliases.yaml"
    path.write_text(text)
    with pytest.raises(AliasError) as refused:
        load_alias_file(path)
    return 2, f"Error: {refused.value.one_line()}", path


def test_gateway_start_refuses_a_bad_alias_file_before_starting(
    cli: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text("aliases:\n  true: tiny\n")
    code, _, err = invoke(cli, "gateway", "start", "--aliases", str(path), "--port", "18933")
    assert (code, one_line_error(err)) == (
        2,
        f"Error: alias file {path}: the name True is read by YAML as a true/false value, not a "
        "name (hint: put it in quotes: 'True')",
    )


def test_what_yaml_reads_as_text_stays_the_alias_name(tmp_path: Path) -> None:
    from sm120.gateway.aliases import load_alias_file

    path = tmp_path / "aliases.yaml"
    path.write_text("aliases:\n  1e3: tiny\n  'true': tiny\n")
    assert [alias.name for alias in load_alias_file(path)] == ["1e3", "true"]


@pytest.mark.parametrize(
    ("key", "shown", "kind"),
    [
        ("true", "True", "a true/false value"),
        ("1.5", "1.5", "a number"),
        ("12", "12", "a number"),
        ("2026-01-01", "2026-01-01", "a date"),
        ("null", "None", "nothing (null)"),
    ],
)
def test_alias_names_yaml_reads_as_other_types_are_refused(
    cli: CliRunner, tmp_path: Path, key: str, shown: str, kind: str
) -> None:
    code, message, path = _alias_error(cli, tmp_path, f"aliases:\n  {key}: tiny\n")
    assert (code, message) == (
        2,
        f"Error: alias file {path}: the name {shown} is read by YAML as {kind}, not a name "
        f"(hint: put it in quotes: '{shown}')",
    )


def test_an_alias_target_of_another_type_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    code, message, path = _alias_error(cli, tmp_path, "aliases:\n  claude: 1.0e+3\n")
    assert (code, message) == (
        2,
        f"Error: alias file {path}: the target of 'claude' 1000.0 is read by YAML as a number, "
        "not a name (hint: put it in quotes: '1000.0')",
    )


def test_an_alias_file_bomb_is_refused_quickly(cli: CliRunner, tmp_path: Path) -> None:
    import time

    layers = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        below = f"*a{level - 1}"
        layers.append(f"a{level}: &a{level} [{', '.join([below] * 10)}]")
    text = "\n".join(layers) + "\naliases: {claude: tiny}\n"
    started = time.monotonic()
    code, message, path = _alias_error(cli, tmp_path, text)
    assert time.monotonic() - started < 10
    assert (code, message) == (
        2,
        f"Error: alias file {path}: the YAML expands to more than 100,000 values {_FILE_HINT}",
    )


def test_a_deeply_nested_alias_file_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    code, message, path = _alias_error(cli, tmp_path, "aliases: " + "[" * 5000 + "]" * 5000)
    assert (code, message) == (
        2,
        f"Error: alias file {path}: line 1: nested deeper than 32 levels {_FILE_HINT}",
    )


def test_too_many_aliases_are_refused(cli: CliRunner, tmp_path: Path) -> None:
    from sm120.gateway.aliases import MAX_ALIASES

    lines = "".join(f"  m{i}: tiny\n" for i in range(MAX_ALIASES + 1))
    code, message, path = _alias_error(cli, tmp_path, "aliases:\n" + lines)
    assert (code, message) == (
        2,
        f"Error: alias file {path} has 4,097 aliases; at most 4,096 are read (hint: use "
        "patterns (claude-*) instead of one alias per name)",
    )


def test_a_duplicate_alias_is_refused(cli: CliRunner, tmp_path: Path) -> None:
    code, message, path = _alias_error(cli, tmp_path, "aliases:\n  a: tiny\n  a: glm52\n")
    assert (code, message) == (
        2,
        f"Error: alias file {path}: duplicate key 'a' at line 3 {_FILE_HINT}",
    )


# --- an engine's NaN, a home that is a file, a deployment folder linked out ----------------------


def test_status_shows_an_engines_nan_as_unknown() -> None:
    from sm120.cli.manage import _status_text
    from sm120.deploy.status import _prefix_cache, parse_gauges

    wanted = {
        "vllm:kv_cache_usage_perc": "kv",
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        "vllm:prefix_cache_queries_total": "queries",
    }
    page = (
        'vllm:kv_cache_usage_perc{m="a"} NaN\n'
        'vllm:num_requests_running{m="a"} 2\nvllm:num_requests_running{m="b"} +Inf\n'
        "vllm:num_requests_waiting 3\n"
        "vllm:prefix_cache_queries_total -Inf\n"
    )
    gauges = parse_gauges(page, wanted)
    assert gauges == {"kv": None, "running": None, "waiting": 3.0, "queries": None}
    assert _prefix_cache({"prefix_queries": None}) == {
        "prefix_cache_hit_pct": None,
        "prefix_cache_queried_tokens": None,
    }
    row = {
        "name": "t", "recipe": "tiny", "runtime": "native", "plan_hash": "h", "running": True,
        "pid": 1, "since": "s", "uptime": "u", "endpoint": "e", "served_model_name": "m",
        "health": 200, "kv_cache_usage_pct": None, "requests_running": None,
        "requests_waiting": 3,
    }  # fmt: skip
    assert "  KV usage  unknown  running unknown, waiting 3" in _status_text(row).splitlines()
    # --json stays JSON a parser takes: null, never NaN.
    assert json.dumps(row, allow_nan=False)


# --- streamed text is gathered in linear time ------------------------------------------------


def test_an_endless_stream_of_text_reaches_the_byte_bound_in_linear_time() -> None:
    import time
    from collections.abc import Iterator
    from http.server import BaseHTTPRequestHandler

    from sm120.server.wire import Wire
    from tests.fakes.loopback_server import LoopbackServer

    piece = {"choices": [{"index": 0, "delta": {"content": "x" * 256}, "finish_reason": None}]}
    event = b"data: " + json.dumps(piece).encode() + b"\n\n"

    class Endless(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for block in _forever(event * 64):
                    self.wfile.write(block)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *_args: object) -> None:
            pass

    def _forever(block: bytes) -> Iterator[bytes]:
        while True:
            yield block

    started = time.monotonic()
    with LoopbackServer(Endless) as server, Wire(server.url, None, timeout=30) as wire:
        exchange = wire.chat([{"role": "user", "content": "hi"}], "tiny")
    assert exchange.error == "/v1/chat/completions streamed more than 32 MiB"
    # 32 MiB of 256-character pieces: with `+=` on the exchange this took minutes.
    assert len(exchange.content) > 20 << 20
    assert time.monotonic() - started < 60
