"""The hybrid linear-attention layouts against vLLM's own allocator on a GPU.

Run on the device (docs/gpu-proof.md says how vLLM gets there), from the project root:

    python benchmarks/hybrid_proof.py --vllm-python /tmp/py --out DIR [--only qwen3next]

Each case serves a reduced-layer config (benchmarks/reduced_models.py: Qwen3-Next's Gated
DeltaNet layers, Kimi-Linear's KDA layers, each with its attention layers every 4th) with dummy
weights and a fixed --kv-cache-memory-bytes, all cases side by side on one GPU (the fixed pool
keeps them from disturbing each other), until the engine prints "GPU KV cache size"; then
`sm120 plan` is given the same inputs through the recipe of that family (qwen38flash for
gdn_hybrid, glm53flash with model.attention=kda_mla_hybrid for Kimi's KDA + MLA) and the
reduced config as --model-dir. DIR/hybrid-proof.json holds every row, the engine logs beside
it; `--table FILE` prints the Markdown table of a finished run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_proof import (  # noqa: E402
    GIB,
    PROOF_ENGINE_VERSION,
    device_name,
    engine_kv_tokens,
    sm120,
)
from reduced_models import write_reduced  # noqa: E402

KV_GIB = 4
CONTEXT = 32768
BATCHED = 8192
# (label, reduced config, recipe that plans it, extra --set, engine flags, planner flags)
CASES: tuple[dict[str, Any], ...] = (
    {"label": "qwen3next-bf16", "model": "qwen3next", "block": 16, "kv": "auto"},
    {"label": "qwen3next-bf16-prefix", "model": "qwen3next", "block": 16, "kv": "auto",
     "prefix": True},
    {"label": "qwen3next-fp8", "model": "qwen3next", "block": 16, "kv": "fp8"},
    {"label": "qwen3next-bf16-mtp2", "model": "qwen3next", "block": 16, "kv": "auto",
     "mtp": 2},
    {"label": "kimilinear-bf16", "model": "kimilinear", "block": 64, "kv": "auto"},
    {"label": "kimilinear-bf16-prefix", "model": "kimilinear", "block": 64, "kv": "auto",
     "prefix": True},
)  # fmt: skip
PLANNED_BY = {
    "qwen3next": ("qwen38flash", []),
    "kimilinear": ("glm53flash", ["model.attention=kda_mla_hybrid"]),
}


def engine_args(case: dict[str, Any]) -> list[str]:
    argv = [
        "--kv-cache-memory-bytes", str(KV_GIB * GIB), "--max-model-len", str(CONTEXT),
        "--max-num-batched-tokens", str(BATCHED), "--block-size", str(case["block"]),
        "--kv-cache-dtype", case["kv"], "--max-num-seqs", "4",
        # the fixed pool decides the KV; a low fraction lets six engines pass the start check
        "--gpu-memory-utilization", "0.1",
        "--enable-prefix-caching" if case.get("prefix") else "--no-enable-prefix-caching",
    ]  # fmt: skip
    if case.get("mtp"):
        spec = {"method": "mtp", "num_speculative_tokens": case["mtp"]}
        argv += ["--speculative-config", json.dumps(spec)]
    return argv


def plan_argv(case: dict[str, Any], model: Path) -> list[str]:
    """`sm120 plan` with the inputs the engine of `case` was given."""
    recipe, extra = PLANNED_BY[case["model"]]
    spec = (
        json.dumps({"method": "mtp", "num_speculative_tokens": case["mtp"]})
        if case.get("mtp")
        else "null"
    )
    settings = [
        "tensor-parallel-size=1", "decode-context-parallel-size=1",
        f"block-size={case['block']}", f"kv-cache-dtype={case['kv']}",
        f"max-num-batched-tokens={BATCHED}", f"speculative-config={spec}",
        f"enable-prefix-caching={'true' if case.get('prefix') else 'false'}",
        "mamba-cache-mode=null", "mamba-ssm-cache-dtype=null", "kv-cache-memory-bytes=null",
        f"image.engine_version={PROOF_ENGINE_VERSION}", *extra,
    ]  # fmt: skip
    argv = [
        "plan", recipe, "--gpus", "1", "--kv-memory-gib", str(KV_GIB), "--model-dir",
        str(model), "--max-model-len", str(CONTEXT), "--json",
    ]  # fmt: skip
    for setting in settings:
        argv += ["--set", setting]
    return argv


def plan(args: argparse.Namespace, case: dict[str, Any], model: Path) -> dict[str, Any]:
    argv = plan_argv(case, model)
    home = Path(tempfile.mkdtemp(prefix="plan-home-"))
    result = sm120(home, args.vllm_python, *argv, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"sm120 plan failed: {result.stderr.strip()[-800:]}")
    return dict(json.loads(result.stdout))


def run_case(args: argparse.Namespace, case: dict[str, Any]) -> dict[str, Any]:
    work: Path = args.out
    # a folder per case: cases of one model run side by side
    model = write_reduced(case["model"], work / "reduced" / case["label"])
    row: dict[str, Any] = {
        "case": case["label"],
        "architecture": json.loads((model / "config.json").read_text())["architectures"][0],
        "kv_cache_dtype": case["kv"],
        "block_size": case["block"],
        "prefix_caching": bool(case.get("prefix")),
        "speculative_tokens": case.get("mtp", 0),
        "max_model_len": CONTEXT,
        "max_num_batched_tokens": BATCHED,
        "kv_cache_memory_bytes": KV_GIB * GIB,
    }
    log_path = work / f"engine-{case['label']}.log"
    try:
        row["vllm_tokens"] = engine_kv_tokens(args, model, engine_args(case), log_path)
        planned = plan(args, case, model)
        row["plan_tokens"] = planned["kv_pool_tokens"]
        row["plan_layout"] = planned["kv_layout"]
        row["ratio"] = round(row["plan_tokens"] / row["vllm_tokens"], 4)
    except Exception as exc:  # one case failing must not lose the others
        row["error"] = str(exc)[-1200:]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | architecture | KV dtype | block | prefix caching | spec tokens | vLLM tokens "
        "| plan tokens | plan / vLLM |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        got = (
            f"{row['vllm_tokens']:,} | {row['plan_tokens']:,} | {row['ratio']:.4f}"
            if "ratio" in row
            else f"{row.get('vllm_tokens', '-')} | - | {row.get('error', '')[:120]}"
        )
        lines.append(
            f"| {row['case']} | {row['architecture']} | {row['kv_cache_dtype']} | "
            f"{row['block_size']} | {'on' if row['prefix_caching'] else 'off'} | "
            f"{row['speculative_tokens']} | {got} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=sys.executable)
    parser.add_argument("--out", type=Path, default=Path("hybrid-proof"))
    parser.add_argument("--only", default="", help="cases whose label starts with this")
    parser.add_argument("--planner-timeout", type=float, default=420)
    parser.add_argument("--table", type=Path, help="print the table of a finished run")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())["rows"]))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in CASES if c["label"].startswith(args.only)]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        rows = list(pool.map(lambda case: run_case(args, case), cases))
    document = {"device": device_name(), "engine": PROOF_ENGINE_VERSION, "rows": rows}
    (args.out / "hybrid-proof.json").write_text(json.dumps(document, indent=2) + "\n")
    print(table(rows))
    return 0 if all("ratio" in row for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
