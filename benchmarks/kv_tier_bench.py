"""The KV tier beyond the GPU, measured (issue 40): does a long prompt evicted from a small GPU
pool come back from host RAM faster than it is prefilled again, and does an idle tier cost
decode speed?

For each arm (off, native, lmcache where the engine's Python has the lmcache package) it runs
`sm120 launch tiny -V gpu` on Llama-3-8B's shape with vLLM's dummy weights (as
benchmarks/gpu_proof.py's bench does), a GPU KV pool of --gpu-pool-tokens, and the tier as the
recipe field renders it (`--set kv_tier.cpu_gib=...`), then:
  1. decode tok/s at one stream, the tier on but idle (no prompt has been evicted yet);
  2. prompt A (--prompt-tokens, >= 32k) cold, then --evict-prompts other prompts of the same
     length (together more than the GPU pool), then A again: the revisit's time to its first
     token, with /metrics' prefix hits by tier over the revisit (sm120/monitor/kv_tier.py);
  3. `sm120 stop`.
Goals: revisit TTFT off / tier >= 5, decode tok/s tier / off >= 0.98.

Every request sends token ids (no tokenizer work, exact lengths) with max_tokens 1 for a TTFT
(non-streaming: the reply is the first token) and ignore_eos for decode. Results go to
OUT/kv-tier-bench.json after every arm (a run cut short keeps what it measured) and a table to
OUT/kv-tier-bench.md.

On the device after .gpu/device-setup (see shared/gpu/README.md), one call:
  /tmp/py benchmarks/kv_tier_bench.py --vllm-python /tmp/py --out $OUT
On a CPU machine it runs the flow on the tiny model (`--shape tiny --recipe-variant ""`) to
check the script; the CPU build has no tier (rule K01), so only the `off` arm runs there.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from gpu_proof import (  # noqa: E402
    BENCH_KEY,
    BENCH_SHAPES,
    capture_engine_log,
    free_port,
    run,
    sm120_env,
    tiny_model,
)

from sm120.monitor.kv_tier import tier_view  # noqa: E402
from sm120.monitor.metrics import parse_metrics  # noqa: E402

# Llama-3-8B in bf16: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes.
BYTES_PER_TOKEN_8B = 32 * 8 * 128 * 2 * 2


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def has_lmcache(vllm_python: str) -> bool:
    probe = run([vllm_python, "-c", "import lmcache"], timeout=120)
    return bool(probe.returncode == 0)


def shaped_model(args: argparse.Namespace, work: Path) -> Path:
    tiny = tiny_model(argparse.Namespace(vllm_python=args.vllm_python), work)
    shape = BENCH_SHAPES[args.shape]
    if shape is None:
        return tiny
    dest = work / f"model-{args.shape}"
    dest.mkdir(exist_ok=True)
    for item in tiny.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            (dest / item.name).write_bytes(item.read_bytes())
    config = {**json.loads((tiny / "config.json").read_text()), **shape}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def launch_sets(args: argparse.Namespace, arm: str) -> list[str]:
    context = args.prompt_tokens + 64
    sets = [f"max-model-len={context}", "max-num-batched-tokens=16384"]
    if args.shape != "tiny":
        sets += [
            "load-format=dummy",
            f"kv-cache-memory-bytes={args.gpu_pool_tokens * BYTES_PER_TOKEN_8B}",
            "hf-overrides=" + json.dumps({"max_position_embeddings": 2 * context}),
        ]
    if args.enforce_eager:
        sets.append("enforce-eager=true")
    if arm != "off":
        sets += [f"kv_tier.backend={arm}", f"kv_tier.cpu_gib={args.tier_gib:g}"]
    return sets


class Server:
    def __init__(self, base: str) -> None:
        self.base = base

    def _post(self, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        request = urllib.request.Request(
            f"{self.base}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {BENCH_KEY}"},
        )
        began = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as reply:
            answer = json.loads(reply.read())
        return time.perf_counter() - began, answer

    def ttft(self, prompt: list[int]) -> float:
        took, _ = self._post({"model": "tiny", "prompt": prompt, "max_tokens": 1})
        return took

    def decode_tps(self, prompt: list[int], tokens: int) -> float:
        """Decode tokens/s at one stream: a cached prompt answered with 1 token and with
        `tokens`; the difference is the decode of tokens - 1."""
        self.ttft(prompt)  # puts the prompt in the prefix cache
        one = self.ttft(prompt)
        took, answer = self._post(
            {"model": "tiny", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
        )
        made = int(answer["usage"]["completion_tokens"])
        return (made - 1) / max(took - one, 1e-9)

    def counters(self) -> dict[str, float]:
        request = urllib.request.Request(
            f"{self.base}/metrics", headers={"Authorization": f"Bearer {BENCH_KEY}"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            return parse_metrics(reply.read().decode()).counters


def prompt_of(seed: int, length: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab - 100) for _ in range(length)]


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def run_arm(args: argparse.Namespace, arm: str, model: Path, work: Path) -> dict[str, Any]:
    home = work / f"home-{arm}"
    (work / arm).mkdir(parents=True, exist_ok=True)  # its captures/ (the engine's log)
    env = {**sm120_env(home, args.vllm_python), "VLLM_CACHE_ROOT": str(work / "vllm-cache")}
    port = free_port()
    argv = ["launch", "tiny", "--port", str(port), "--model-dir", str(model)]
    argv += ["--api-key", BENCH_KEY]
    if args.recipe_variant:
        argv += ["-V", args.recipe_variant]
    if arm == "lmcache":
        # K01 asks an image to declare lmcache; the native runtime's Python has it (checked).
        argv += ["--force", "K01"]
    for setting in launch_sets(args, arm):
        argv += ["--set", setting]
    log(f"{arm}: sm120 {' '.join(argv)}")
    began = time.monotonic()
    launched = run([sys.executable, "-m", "sm120", *argv], env=env, timeout=args.launch_timeout)
    result: dict[str, Any] = {"arm": arm, "launch_s": round(time.monotonic() - began, 1)}
    if launched.returncode != 0:
        result["error"] = (launched.stderr or launched.stdout)[-2000:]
        capture_engine_log(home, work / arm)
        return result
    try:
        result.update(measure(args, Server(f"http://127.0.0.1:{port}"), model))
    finally:
        capture_engine_log(home, work / arm)  # before the stop, which clears the state
        run([sys.executable, "-m", "sm120", "stop"], env=env, timeout=180)
    return result


def measure(args: argparse.Namespace, server: Server, model: Path) -> dict[str, Any]:
    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    server.ttft(prompt_of(1, 16, vocab))  # warm-up
    decode = [
        server.decode_tps(prompt_of(100 + i, 128, vocab), args.decode_tokens)
        for i in range(args.decode_rounds)
    ]
    long_a = prompt_of(7, args.prompt_tokens, vocab)
    cold = server.ttft(long_a)
    evicting = [
        server.ttft(prompt_of(1000 + i, args.prompt_tokens, vocab))
        for i in range(args.evict_prompts)
    ]
    before = server.counters()
    revisit = server.ttft(long_a)
    after = server.counters()
    moved = delta(after, before)
    return {
        "decode_tps": [round(v, 2) for v in decode],
        "decode_tps_median": round(statistics.median(decode), 2),
        "cold_ttft_s": round(cold, 4),
        "evicting_ttft_s": [round(v, 4) for v in evicting],
        "revisit_ttft_s": round(revisit, 4),
        "revisit_gpu_hit_tokens": moved.get("prefix_hits"),
        "revisit_tier_hit_tokens": moved.get("tier_hits"),
        "tier_since_start": tier_view(after),
    }


def summary(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    off = arms.get("off", {})
    found: dict[str, Any] = {}
    for arm in ("native", "lmcache"):
        tier = arms.get(arm, {})
        if "revisit_ttft_s" in tier and "revisit_ttft_s" in off:
            speedup = off["revisit_ttft_s"] / tier["revisit_ttft_s"]
            decode = tier["decode_tps_median"] / off["decode_tps_median"]
            found[arm] = {
                "revisit_speedup": round(speedup, 2),
                "revisit_goal_5x": speedup >= 5,
                "idle_decode_ratio": round(decode, 4),
                "decode_goal_0_98": decode >= 0.98,
            }
    return found


def markdown(document: dict[str, Any]) -> str:
    rows = [
        "| arm | launch s | decode tok/s (median) | cold TTFT s | revisit TTFT s | revisit hits "
        "GPU / tier (tokens) |",
        "|---|---|---|---|---|---|",
    ]
    for name, arm in document["arms"].items():
        if "error" in arm:
            rows.append(f"| {name} | failed: {arm['error'][-200:]!r} | | | | |")
            continue
        rows.append(
            f"| {name} | {arm['launch_s']} | {arm['decode_tps_median']} | {arm['cold_ttft_s']} "
            f"| {arm['revisit_ttft_s']} | {arm['revisit_gpu_hit_tokens']} / "
            f"{arm['revisit_tier_hit_tokens']} |"
        )
    lines = [f"# KV tier bench ({document['device']})", "", *rows, ""]
    for arm, verdict in document["summary"].items():
        lines.append(
            f"- {arm}: revisit {verdict['revisit_speedup']}x faster than off (goal 5x: "
            f"{'met' if verdict['revisit_goal_5x'] else 'missed'}), idle decode "
            f"{verdict['idle_decode_ratio']} of off (goal 0.98: "
            f"{'met' if verdict['decode_goal_0_98'] else 'missed'})"
        )
    for note in document["notes"]:
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default="/tmp/py")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kv-tier-bench"))
    parser.add_argument("--arms", default="off,native,lmcache")
    parser.add_argument("--shape", default="8b", choices=sorted(BENCH_SHAPES))
    parser.add_argument("--recipe-variant", default="gpu", help='"" for the CPU tiny recipe')
    parser.add_argument("--prompt-tokens", type=int, default=32768)
    parser.add_argument("--gpu-pool-tokens", type=int, default=49152)
    parser.add_argument("--evict-prompts", type=int, default=3)
    parser.add_argument("--tier-gib", type=float, default=24.0)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--decode-rounds", type=int, default=5)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--launch-timeout", type=float, default=400)
    parser.add_argument(
        "--budget-s", type=float, default=510, help="start no arm that would end past this"
    )
    args = parser.parse_args()
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    arms = [arm for arm in args.arms.split(",") if arm]
    if "lmcache" in arms and not has_lmcache(args.vllm_python):
        arms.remove("lmcache")
        notes.append(f"lmcache arm skipped: `import lmcache` fails in {args.vllm_python}")
    model = shaped_model(args, args.work)
    device = "cpu"
    if shutil.which("nvidia-smi"):
        smi = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], timeout=30)
        device = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else device
    document: dict[str, Any] = {"device": device, "settings": vars(args) | {"out": str(args.out),
        "work": str(args.work)}, "arms": {}, "summary": {}, "notes": notes}  # fmt: skip
    longest = 0.0  # the slowest arm so far: the next one is expected to take as long
    for arm in arms:
        if time.monotonic() - started + longest > args.budget_s:
            notes.append(f"{arm} arm skipped: it would end past the {args.budget_s:g} s budget")
            continue
        arm_began = time.monotonic()
        document["arms"][arm] = run_arm(args, arm, model, args.work)
        longest = max(longest, time.monotonic() - arm_began)
        document["summary"] = summary(document["arms"])
        (args.out / "kv-tier-bench.json").write_text(json.dumps(document, indent=2))
        log(f"{arm}: {json.dumps(document['arms'][arm])[:600]}")
    (args.out / "kv-tier-bench.json").write_text(json.dumps(document, indent=2))
    (args.out / "kv-tier-bench.md").write_text(markdown(document))
    for arm in arms:
        for log_file in (args.work / arm).glob("captures/engine.log"):
            (args.out / f"engine-{arm}.log").write_text(log_file.read_text(errors="replace"))
    print(markdown(document))


if __name__ == "__main__":
    main()
