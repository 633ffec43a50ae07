"""Bench and gate reports as text tables (stdout); the JSON forms are the dicts themselves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def _num(value: Any, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else "-"


def _secs(value: Any) -> str:
    return f"{value:.3f}s" if isinstance(value, (int, float)) else "-"


def _where(report: Mapping[str, Any]) -> str:
    """The image for a container run; a native run names its runtime, never an image."""
    if report.get("image"):
        return f"image {report['image']}"
    return f"runtime {report.get('runtime') or '?'}"


def show_bench(report: Mapping[str, Any], console: Console | None = None) -> None:
    out = console or Console(soft_wrap=True)
    out.print(
        f"[bold]{report['deployment']}[/bold]  model {report['model']}  "
        f"{_where(report)}  plan {report.get('plan_hash') or '?'}  "
        f"mode {report['mode']}"
    )
    decode = report.get("decode") or {}
    out.print(
        f"decode (single stream, {decode.get('output_tokens', '?')} tokens): "
        f"[bold]{_num(decode.get('tps'))} tok/s[/bold]  [dim]({decode.get('tool', '-')})[/dim]"
    )
    if report.get("prefill"):
        table = Table("prompt tokens", "TTFT", "prefill tok/s", "ok/failed", "tool")
        for point in report["prefill"]:
            table.add_row(
                f"{point['prompt_tokens']:,}",
                _secs(point.get("ttft_s")),
                _num(point.get("prefill_tps")),
                f"{point.get('requests', 0)}/{point.get('failed', 0)}",
                point.get("tool", "-"),
            )
        out.print(table)
    if report.get("concurrency"):
        table = Table(
            "concurrency", "aggregate tok/s", "per-request tok/s", "mean TTFT", "ok/failed", "tool"
        )
        for level in report["concurrency"]:
            table.add_row(
                str(level["concurrency"]),
                _num(level.get("aggregate_tps")),
                _num(level.get("per_request_tps")),
                _secs(level.get("mean_ttft_s")),
                f"{level.get('requests', 0)}/{level.get('failed', 0)}",
                level.get("tool", "-"),
            )
        out.print(table)
    spec = report.get("spec_decode")
    configured = _configured_speculative(report.get("speculative"))
    if spec:
        rate = spec.get("acceptance_rate")
        out.print(
            f"speculative decoding{configured}: acceptance "
            f"{_num(rate * 100 if rate is not None else None)}%"
            f", length {_num(spec.get('acceptance_length'), 2)} "
            f"({spec['accepted_tokens']}/{spec['draft_tokens']} draft tokens, "
            f"{spec['drafts']} drafts)  [dim]({spec['tool']})[/dim]"
        )
    elif configured:
        out.print(
            f"speculative decoding{configured}: configured, but no draft counters moved in /metrics"
        )
    else:
        out.print("speculative decoding: none (no draft counters moved in /metrics)")
    cache = report.get("prefix_cache")
    if cache and cache.get("queried_tokens"):
        share = cache["hit_tokens"] / cache["queried_tokens"] * 100
        out.print(
            f"prefix cache: {share:.1f}% of {cache['queried_tokens']:,} prompt tokens served "
            "from the cache (bench prompts are new by design: a high share flatters TTFT)"
        )
    for name, how in (report.get("tools") or {}).items():
        out.print(f"[dim]{name}: {how}[/dim]")
    for note in report.get("notes") or []:
        out.print(f"[dim]note: {note}[/dim]")
    _show_against(report.get("against"), out)
    _show_comparisons(report.get("comparisons") or [], out)


def _configured_speculative(speculative: Any) -> str:
    """' (mtp, 3 draft tokens)' for the plan's speculative decoding; '' when it has none."""
    if not isinstance(speculative, Mapping) or not speculative.get("method"):
        return ""
    return f" ({speculative['method']}, {speculative.get('num_speculative_tokens')} draft tokens)"


def _show_against(against: Mapping[str, Any] | None, out: Console) -> None:
    if not against:
        return
    measured = _num(against["measured_decode_tok_s"])
    if against.get("of_published") is not None:
        out.print(
            f"decode {measured} tok/s is {against['of_published'] * 100:.0f}% of the published "
            f"{_num(against['published_decode_tok_s'])} tok/s ({against['published_source']})",
            markup=False,
        )
    if against.get("of_roofline") is not None:
        out.print(
            f"decode {measured} tok/s is {against['of_roofline'] * 100:.0f}% of the roofline "
            f"{_num(against['roofline_decode_tok_s'])} tok/s (memory bandwidth bound)",
            markup=False,
        )


def _show_comparisons(comparisons: Sequence[Mapping[str, Any]], out: Console) -> None:
    for item in comparisons:
        change = item["change"] * 100
        mark = "[red]REGRESSION[/red]" if item["regression"] else "ok"
        out.print(
            f"{mark} {item['figure']}: {_num(item['measured'])} vs {item['against']} "
            f"{_num(item['reference'])} ({change:+.1f}%)"
        )
