#!/usr/bin/env bash
# The GPU proof on a four-GPU machine of the `device` tool, in two calls of at most 10 minutes:
#   bash benchmarks/gpu_proof_device.sh start   # after .gpu/device-setup, same call
#   bash benchmarks/gpu_proof_device.sh wait    # next call, within 30 s of the first ending
# `start` runs, in the background (setsid: they outlive the call), one job per GPU set:
#   serve    GPU 0      launch (sm120 vs bare vllm serve) and bench, then the planner at TP 4
#                       (+ DCP 4) on all four GPUs once the planner job below is done
#   planner  GPUs 2,3   facts, captures, doctor, the planner at TP 2, then DeepSeek-V4 at TP 1
# On a two-GPU machine `start` runs one job instead, in order, so the launch pairs have the
# machine to themselves: DeepSeek-V4's planner at TP 1 and the P2P tests, the planner at TP 2,
# the launch pairs, then the gateway's sleep/wake test (each test's output in its own log).
# `wait` waits for the jobs and copies their results into $OUT.
#   bash benchmarks/gpu_proof_device.sh serve   # any machine: facts, the launch pairs and the
#                                               # bench on GPU 0 alone (PAIRS, ROUNDS); then `wait`
#   bash benchmarks/gpu_proof_device.sh gap     # any machine: launch_gap.py's sides (GAP_ROUNDS),
#                                               # the bench (ROUNDS), then `pytest -m gpu tests/gpu`
#   bash benchmarks/gpu_proof_device.sh bench   # any machine: the bench alone (ROUNDS) on
#                                               # BENCH_MODEL (default 8b: Llama-3-8B's shape,
#                                               # dummy weights), REQUESTS per point and
#                                               # round (default 16), PAIRS request-level pairs per
#                                               # length, PROBE rounds of short_ttft_probe.py
#                                               # (default none of either; ROUNDS=0: no bench
#                                               # rounds), then `pytest -m gpu tests/gpu`
#                                               # (GPU_TESTS=0 leaves them out)
#   bash benchmarks/gpu_proof_device.sh ab DIR  # launch A/B: this checkout's sm120 against the
#                                               # one in DIR (e.g. `git archive OLD | tar -x`),
#                                               # bare vllm serve beside both; then `wait`
set -u
export VLLM_PYTHON=/tmp/py PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/tmp/gpu-proof-jobs
proof="/tmp/py benchmarks/gpu_proof.py --vllm-python /tmp/py --out $work"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)

gpu_tests="/tmp/py -m pytest -m gpu -p no:cacheprovider -s -q"

case "${1:-}" in
start)
  if [ "$gpus" -eq 2 ]; then
    mkdir -p "$work"
    touch "$work/planner.done"
    setsid bash -c "
      CUDA_VISIBLE_DEVICES=1 $proof --label planner-dsv4-tp1 --steps facts,captures,doctor,planner --tp 1 --only dsv4 &
      $gpu_tests tests/gpu/test_p2p_gpu.py > $work/pytest-p2p.log 2>&1
      wait
      $proof --label planner-tp2 --steps planner --tp 2 --only dsv4
      CUDA_VISIBLE_DEVICES=0 $proof --label serve --steps launch
      $gpu_tests tests/gpu/test_gpu_gateway_sleep.py > $work/pytest-sleep.log 2>&1
      touch $work/serve.done" >"$work/serve.log" 2>&1 </dev/null &
    exit 0
  fi
  mkdir -p "$work"
  setsid bash -c "
    CUDA_VISIBLE_DEVICES=2,3 $proof --label planner-tp2 --steps facts,captures,doctor,planner --tp 2
    CUDA_VISIBLE_DEVICES=2 $proof --label planner-dsv4-tp1 --steps planner --tp 1 --only dsv4
    touch $work/planner.done" >"$work/planner.log" 2>&1 </dev/null &
  setsid bash -c "
    CUDA_VISIBLE_DEVICES=0 $proof --label serve --steps launch,bench --bench-rounds 4
    while [ ! -e $work/planner.done ]; do sleep 5; done
    if [ $gpus -ge 4 ]; then
      $proof --label planner-tp4 --steps planner --tp 4 --dcp 4 --only glm47:fp8,glm52,dsv4
    fi
    touch $work/serve.done" >"$work/serve.log" 2>&1 </dev/null &
  ;;
serve)
  mkdir -p "$work"
  touch "$work/planner.done"
  setsid bash -c "
    CUDA_VISIBLE_DEVICES=0 $proof --label serve --steps facts,doctor,launch,bench \
      --launch-pairs ${PAIRS:-3} --bench-rounds ${ROUNDS:-6}
    touch $work/serve.done" >"$work/serve.log" 2>&1 </dev/null &
  exit 0
  ;;
gap)
  mkdir -p "$work"
  touch "$work/planner.done"
  setsid bash -c "
    CUDA_VISIBLE_DEVICES=0 /tmp/py benchmarks/launch_gap.py --vllm-python /tmp/py --out $work \
      --rounds ${GAP_ROUNDS:-3}
    (cd /tmp && tar -czf $work/launch-gap-logs.tgz launch-gap-*/logs)
    CUDA_VISIBLE_DEVICES=0 $proof --label bench --steps facts,bench --bench-rounds ${ROUNDS:-6} \
      --bench-model ${BENCH_MODEL:-tiny}
    CUDA_VISIBLE_DEVICES=0 $gpu_tests tests/gpu > $work/pytest-gpu.log 2>&1
    touch $work/serve.done" >"$work/serve.log" 2>&1 </dev/null &
  exit 0
  ;;
bench)
  mkdir -p "$work"
  touch "$work/planner.done"
  setsid bash -c "
    CUDA_VISIBLE_DEVICES=0 $proof --label bench-${BENCH_MODEL:-8b} --steps facts,bench \
      --bench-rounds ${ROUNDS:-6} --bench-model ${BENCH_MODEL:-8b} \
      --bench-requests ${REQUESTS:-16} --bench-pairs ${PAIRS:-0} --bench-probe ${PROBE:-0}
    [ ${GPU_TESTS:-1} = 0 ] || CUDA_VISIBLE_DEVICES=0 $gpu_tests tests/gpu > $work/pytest-gpu.log 2>&1
    touch $work/serve.done" >"$work/serve.log" 2>&1 </dev/null &
  exit 0
  ;;
ab)
  [ -d "${2:-}/sm120" ] || { echo "usage: $0 ab DIR (a checkout with sm120/ in it)" >&2; exit 2; }
  mkdir -p "$work"
  touch "$work/planner.done"
  setsid bash -c "
    $proof --label launch-ab --steps facts,launch --launch-pairs ${PAIRS:-3} --compare-tree $(realpath "$2")
    touch $work/serve.done" >"$work/serve.log" 2>&1 </dev/null &
  exit 0
  ;;
wait)
  deadline=$((SECONDS + ${2:-560}))
  until [ -e "$work/serve.done" ] && [ -e "$work/planner.done" ]; do
    [ $SECONDS -ge $deadline ] && break
    sleep 5
  done
  ;;
*)
  echo "usage: $0 start|serve|gap|bench|ab DIR|wait [seconds]" >&2
  exit 2
  ;;
esac
grep -h "gpu-proof" "$work"/*.log 2>/dev/null | cut -c1-300 | tail -40
tail -n 3 "$work"/pytest-*.log 2>/dev/null
if [ -n "${OUT:-}" ]; then
  cp "$work"/gpu-proof-*.json "$work"/launch-pairs-*.json "$work"/bench-rounds-*.json \
    "$work"/launch-gap*.json "$work"/short-ttft-probe-*.json "$OUT"/ 2>/dev/null
  tar -czf "$OUT/jobs.tgz" -C "$work" . 2>/dev/null
fi
