"""Literal prefilters (sm120/logs/prefilter.py): the literal a regex needs must really be needed."""

from __future__ import annotations

import re

import pytest

from sm120.logs.failures import load_catalogue
from sm120.logs.prefilter import alternation, prefix_closure, rare_anchor, required_literal
from tests.fakes.engine_logs import REAL_LINES


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        ("get_pip_packages", "get_pip_packages"),
        (r"prefill_wrapper\.plan\(", "prefill_wrapper.plan("),
        (r"KeyError: '[^']*[kv]_scale'", "KeyError: '"),
        (r"TllmGenFmhaRunner.*Unsupported architecture", "Unsupported architecture"),
        (r"with the models?'s max seq len", "with the model"),  # the optional s is dropped
        (r"ab+cdef", "cdef"),  # b repeats: "ab" is needed, "abc..." is not
        (r"xyz+", "xyz"),
        (r"found in \d+ seconds?", "found in "),
        (r"detected: (?!VLLM_BUILD_|VLLM_IMAGE_TAG\b)", "detected: "),
        (r"flashinfer-(?:cubin|jit-cache) version \([^)]*\) does not match", ") does not match"),
        (r"a{2,3}bcd", "bcd"),
        (r"\x41BCD", "BCD"),  # the hex digits belong to the escape, not to the literal
        (r"\u00e9tat final", "tat final"),
        (r"\N{BULLET} point list", " point list"),
        (r"(a)\1 backref here", " backref here"),
        (r"^start of line", "start of line"),
        (r"done\.$", "done."),
        (r"ab*?cde", "cde"),
    ],
)
def test_required_literal(pattern: str, literal: str) -> None:
    assert required_literal(pattern) == literal
    sample = _a_match(pattern)
    assert re.search(pattern, sample) is not None and literal in sample


def _a_match(pattern: str) -> str:
    samples = {
        r"ab+cdef": "abbbcdef",
        r"xyz+": "xyzzz",
        r"a{2,3}bcd": "aaabcd",
        r"\x41BCD": "ABCD",
        r"\u00e9tat final": "\u00e9tat final",
        r"\N{BULLET} point list": "\u2022 point list",
        r"(a)\1 backref here": "aa backref here",
        r"^start of line": "start of line",
        r"done\.$": "done.",
        r"ab*?cde": "acde",
        r"TllmGenFmhaRunner.*Unsupported architecture": "TllmGenFmhaRunner: Unsupported "
        "architecture",
        r"KeyError: '[^']*[kv]_scale'": "KeyError: 'x.k_scale'",
        r"with the models?'s max seq len": "with the model's max seq len",
        r"found in \d+ seconds?": "found in 60 seconds",
        r"detected: (?!VLLM_BUILD_|VLLM_IMAGE_TAG\b)": "detected: FOO",
        r"flashinfer-(?:cubin|jit-cache) version \([^)]*\) does not match": (
            "flashinfer-cubin version (1) does not match"
        ),
    }
    return samples.get(pattern, pattern.replace("\\", ""))


@pytest.mark.parametrize(
    "pattern", ["(?i)case insensitive", "alpha|beta", "(?x) verbose  pattern", r"\d+\s+", "ab"]
)
def test_no_literal_when_none_is_certain(pattern: str) -> None:
    assert required_literal(pattern) is None


def test_every_catalogue_signature_has_a_literal_its_real_lines_contain() -> None:
    for mode in load_catalogue().values():
        for signature in mode.signatures:
            literal = required_literal(signature)
            assert literal, f"{mode.id}: {signature!r} has no literal to prefilter on"
            for line in REAL_LINES.get(mode.id, []):
                if re.search(signature, line):
                    assert literal in line, (mode.id, signature, line)


def test_rare_anchor_starts_at_the_rarest_character() -> None:
    by_frequency = " etaoinsrl"
    assert rare_anchor("No available shared memory", by_frequency) == "No available shared memory"
    assert rare_anchor("rare Xylophone here", by_frequency) == "Xylophone here"
    # Never shorter than the minimum: the rare Q is too close to the end to start an anchor.
    assert rare_anchor("aaaaaaaaaQ", by_frequency, minimum=6) == "aaaaaaaaaQ"
    assert rare_anchor("aaaaaQaaaaaa", by_frequency, minimum=6) == "Qaaaaaa"
    assert rare_anchor("short", by_frequency) == "short"


def test_alternation_reports_the_longest_anchor_and_closure_adds_the_rest() -> None:
    anchors = ["KV cache", "KV cache size: ", "Maximum concurrency", "Model loading"]
    gate = alternation(anchors)
    found = gate.search("x GPU KV cache size: 5 tokens")
    assert found is not None and found.group() == "KV cache size: "
    assert set(prefix_closure(anchors)["KV cache size: "]) == {"KV cache", "KV cache size: "}
    loading = gate.search("Model loading took 1 GiB")
    assert loading is not None and loading.group() == "Model loading"
    assert gate.search("nothing to see here") is None
