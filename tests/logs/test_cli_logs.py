"""`sm120 logs` (unchanged: tail of the deployment's log) and `sm120 logs parse FILE`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sm120.cli.app import app
from sm120.engine.state import DeploymentState, deployment_dir, save_state
from tests.helpers import DATA_DIR, invoke

CORPUS = DATA_DIR / "vllm_logs"
STARTUP = CORPUS / "v0.11.0rc2_compose_rocm_startup.log"


def test_parse_json_prints_one_object_per_event(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "logs", "parse", str(STARTUP), "--json")
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {"kind": "model_loaded", "gib": 51.7891, "seconds": 29.929735},
        {"kind": "kv_memory", "gib": 109.86},
        {"kind": "kv_cache", "tokens": 205696, "device": "GPU"},
        {"kind": "max_concurrency", "tokens_per_request": 4096, "x": 50.05},
        {"kind": "cuda_graphs", "seconds": 22.0, "gib": 1.02},
        {"kind": "engine_init", "seconds": 102.52},
        {"kind": "ready"},
    ]
    assert err == "54 lines, 7 events\n"


def test_parse_readable(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "logs", "parse", str(CORPUS / "v0.11_dp_shm_broadcast_stall.log"))
    assert code == 0
    assert out.splitlines()[:2] == [
        "stats            engine 0, prompt 0.0 tok/s, gen 0.0 tok/s, running 2, waiting 0, "
        "KV 1.7%, prefix hit 0.0%",
        "stats            engine 1, prompt 0.0 tok/s, gen 0.0 tok/s, running 2, waiting 0, "
        "KV 1.7%, prefix hit 0.0%",
    ]
    assert out.splitlines()[2].startswith("failure          F22: (EngineCore_DP0 pid=47415) INFO")


def test_parse_reads_stdin(cli: CliRunner) -> None:
    text = (CORPUS / "v0.3_pending_no_period.log").read_text(encoding="utf-8")
    result = cli.invoke(app, ["logs", "parse", "-", "--json"], input=text)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "kind": "stats",
        "prompt_tps": 0.0,
        "gen_tps": 44.9,
        "running": 2,
        "waiting": 3,
        "swapped": 0,
        "kv_usage_pct": 82.1,
        "cpu_kv_usage_pct": 0.0,
    }


def test_parse_counts_index_topk_skip_lines(cli: CliRunner, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text(
        "".join(
            f"INFO [deepseek_v2.py:1086] Using index_topk_pattern/index_topk_freq to skip sparse "
            f"MLA indexer computation on layer {layer}.\n"
            for layer in (3, 4)
        )
    )
    code, out, err = invoke(cli, "logs", "parse", str(log), "--json")
    assert code == 0
    assert [json.loads(line)["count"] for line in out.splitlines()] == [1, 2]
    assert err == "2 lines, 2 events, 2 index-topk skip lines (F09)\n"


def test_parse_missing_file_is_one_line_error(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "logs", "parse", "nope.log")
    assert code == 2
    assert out == ""
    assert err == (
        "Error: cannot read nope.log: No such file or directory "
        "(hint: pass the path of a log file, or - to read stdin)\n"
    )


def test_parse_directory_is_one_line_error(cli: CliRunner, tmp_path: Path) -> None:
    code, _, err = invoke(cli, "logs", "parse", str(tmp_path))
    assert code == 2
    assert err == (
        f"Error: cannot read {tmp_path}: Is a directory "
        "(hint: pass the path of a log file, or - to read stdin)\n"
    )


def test_parse_needs_a_file(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "logs", "parse")
    assert code == 2
    assert "Missing argument 'FILE'" in err


def test_logs_without_a_deployment_is_unchanged(cli: CliRunner) -> None:
    for args in (["logs"], ["logs", "-n", "5"], ["logs", "-f"]):
        code, out, err = invoke(cli, *args)
        assert code == 2, args
        assert out == ""
        assert err == "Error: no deployment is running (hint: start one: sm120 launch tiny)\n"


def test_logs_shows_the_last_lines_of_the_deployment_log(cli: CliRunner) -> None:
    folder = deployment_dir("tiny")
    log = folder / "logs" / "serve.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {number}\n" for number in range(1, 8)))
    save_state(
        DeploymentState(
            name="tiny",
            recipe="tiny",
            runtime="native",
            supervisor_pid=4_194_304,  # PID_MAX_LIMIT itself: never a live process
            engine_pid=None,
            host="127.0.0.1",
            port=8000,
            plan_hash="abc",
            started_at=0.0,
            log_path=str(log),
            exit_file=str(folder / "exit.json"),
            served_model_name="tiny",
            model_dir=None,
            api_key_file=None,
        )
    )
    assert invoke(cli, "logs", "-n", "2") == (0, "line 6\nline 7\n", "")
    assert invoke(cli, "logs", "--lines", "3", "--name", "tiny")[1] == "line 5\nline 6\nline 7\n"


def test_logs_help_lists_parse(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "logs", "--help")
    assert code == 0
    assert "parse" in out and "--follow" in out
