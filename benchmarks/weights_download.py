"""`sm120 download` against huggingface_hub's own `snapshot_download`, from one local Hub
stand-in (tests/fakes/hub.py) serving the same repo to both:

  fresh    wall time to fetch the whole repo into an empty folder (same file selection)
  resume   the first run dies mid-shard (connection cut, then a 503 on the retry); bytes the
           second run has to fetch again, and its wall time

Localhost has no bandwidth limit, so `fresh` measures client overhead (hashing included: sm120
checks every file against the Hub's sha256 / git id), not network speed. `resume` is where a
real link pays: every byte the second run re-fetches is a byte of a 5 GB shard over the WAN.

Run: python benchmarks/weights_download.py [--shards 4] [--shard-mb 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sm120.core.errors import SM120Error
from sm120.weights.download import hub_source, plan_download, run_download
from sm120.weights.selection import ALLOW_PATTERNS, IGNORE_PATTERNS
from tests.fakes.checkpoints import checkpoint
from tests.fakes.hub import FakeHub

REPO_ID = "bench/model"


def repo_files(shards: int, shard_mb: int) -> dict[str, bytes]:
    files = checkpoint(tuple([shard_mb * 1024 * 1024] * shards))
    files["pytorch_model.bin"] = random.Random(1).randbytes(shard_mb * 1024 * 1024)
    return files


def fetched_bytes(hub: FakeHub, files: dict[str, bytes]) -> int:
    """Bytes the server was asked for: whole files, or the rest after a Range start."""
    by_name = {name.rsplit("/", 1)[-1]: len(data) for name, data in files.items()}
    by_sha = {hashlib.sha256(data).hexdigest(): len(data) for data in files.values()}
    total = 0
    for seen in hub.requests("GET"):
        last = seen.path.rsplit("/", 1)[-1]
        if "/cdn/" in seen.path:
            size = by_sha[last]
        elif "/resolve/" in seen.path:
            size = by_name[last]
        else:
            continue  # the listing
        ranged = seen.header("range")
        total += size - (int(ranged.removeprefix("bytes=").rstrip("-")) if ranged else 0)
    return total


def sm120_fetch(dest: Path, commit: str) -> None:
    run_download(plan_download(hub_source(REPO_ID, commit), dest))


def hf_fetch(dest: Path, commit: str) -> None:
    from huggingface_hub import snapshot_download

    snapshot_download(
        REPO_ID,
        revision=commit,
        local_dir=dest,
        allow_patterns=list(ALLOW_PATTERNS),
        ignore_patterns=list(IGNORE_PATTERNS),
    )


def timed(fetch: object, dest: Path, commit: str) -> tuple[float, bool]:
    started = time.perf_counter()
    try:
        fetch(dest, commit)  # type: ignore[operator]
        ok = True
    except (SM120Error, OSError):
        ok = False
    return time.perf_counter() - started, ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import huggingface_hub  # configures its logger: quiet it afterwards

    logging.getLogger(huggingface_hub.__name__).setLevel(logging.ERROR)
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    files = repo_files(args.shards, args.shard_mb)
    shard = f"model-00001-of-{args.shards:05d}.safetensors"
    cut = len(files[shard]) * 6 // 10
    clients = {"sm120": sm120_fetch, "huggingface_hub": hf_fetch}
    fresh: dict[str, list[float]] = {name: [] for name in clients}
    resume: dict[str, list[tuple[float, int]]] = {name: [] for name in clients}
    with FakeHub() as hub, tempfile.TemporaryDirectory() as scratch:
        os.environ["HF_ENDPOINT"] = hub.url
        os.environ["HF_HOME"] = str(Path(scratch) / "hf-home")
        commit = hub.add_repo(REPO_ID, files)
        for round_ in range(args.rounds):
            for name, fetch in clients.items():
                dest = Path(scratch) / f"{name}-{round_}"
                seconds, ok = timed(fetch, dest, commit)
                assert ok, f"{name} failed a clean download"
                fresh[name].append(seconds)
                shutil.rmtree(dest)

                hub.fault(shard, f"cut:{cut}", "status:503")
                _, ok = timed(fetch, dest, commit)
                assert not ok, "the scripted failure did not happen"
                hub.seen.clear()
                seconds, ok = timed(fetch, dest, commit)
                assert ok, f"{name} did not finish on the second run"
                resume[name].append((seconds, fetched_bytes(hub, files)))
                shutil.rmtree(dest)

    total_mb = sum(len(files[p]) for p in files if p != "pytorch_model.bin") / 1e6
    print(
        f"repo: {args.shards} x {args.shard_mb} MiB shards (+ a .bin neither fetches), "
        f"{total_mb:.0f} MB fetched; {args.rounds} rounds, medians"
    )
    ours, theirs = statistics.median(fresh["sm120"]), statistics.median(fresh["huggingface_hub"])
    print(
        f"fresh      sm120 {ours:6.2f} s   huggingface_hub {theirs:6.2f} s   "
        f"ratio {ours / theirs:.2f}x"
    )
    ours_s = statistics.median(s for s, _ in resume["sm120"])
    theirs_s = statistics.median(s for s, _ in resume["huggingface_hub"])
    ours_b = statistics.median(b for _, b in resume["sm120"]) / 1e6
    theirs_b = statistics.median(b for _, b in resume["huggingface_hub"]) / 1e6
    print(
        f"resume     sm120 {ours_b:6.1f} MB {ours_s:5.2f} s   huggingface_hub {theirs_b:6.1f} MB "
        f"{theirs_s:5.2f} s   bytes ratio {ours_b / theirs_b:.2f}x"
    )


if __name__ == "__main__":
    main()
