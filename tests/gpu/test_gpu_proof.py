"""The GPU proof runner's bookkeeping (the GPU runs themselves: tests/gpu/test_gpu_cuda.py and
benchmarks/results/gpu-proof.json), and the committed results' shape."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_proof
from reduced_models import CONFIGS, write_reduced

RESULTS = REPO / "benchmarks" / "results" / "gpu-proof.json"


def test_merge_keeps_the_first_facts_and_every_planner_row(tmp_path: Path) -> None:
    one = tmp_path / "gpu-proof-a.json"
    two = tmp_path / "gpu-proof-b.json"
    one.write_text(
        json.dumps(
            {
                "label": "a",
                "steps": {"facts": "ok"},
                "device": "1x NVIDIA H100 80GB HBM3",
                "doctor_json_ok": True,
                "planner": [
                    {
                        "recipe": "glm47", "architecture": "Glm4MoeForCausalLM", "tp": 1,
                        "kv_dtype": "fp8", "vllm_tokens": 524288, "plan_tokens": 524288,
                        "ratio": 1.0,
                    }
                ],
            }
        )
    )  # fmt: skip
    two.write_text(
        json.dumps(
            {
                "label": "b",
                "device": "2x NVIDIA H100 80GB HBM3",
                "planner": [{"recipe": "dsv4", "tp": 2, "kv_dtype": "fp8", "error": "no line"}],
            }
        )
    )
    gpu_proof.merge([one, two], tmp_path / "out")
    merged = json.loads((tmp_path / "out" / "gpu-proof.json").read_text())
    assert merged["device"] == "1x NVIDIA H100 80GB HBM3"
    assert [row["recipe"] for row in merged["planner"]] == ["glm47", "dsv4"]
    assert "label" not in merged and "steps" not in merged
    table = (tmp_path / "out" / "gpu-proof.md").read_text()
    assert "| glm47 | Glm4MoeForCausalLM | 1 | 1 | fp8 | 524,288 | 524,288 | 1.0 |" in table
    assert "| dsv4 | None | 2 | 1 | fp8 | did not run: no line | | |" in table


def test_reduced_configs_plan_with_the_real_kv_dimensions(tmp_path: Path) -> None:
    """What the planner reads from each reduced config is the real checkpoint's KV shape."""
    for recipe in CONFIGS:
        config = json.loads((write_reduced(recipe, tmp_path / recipe) / "config.json").read_text())
        assert config["architectures"][0].endswith("ForCausalLM")
    assert CONFIGS["glm47"]["num_key_value_heads"] == 8 and CONFIGS["glm47"]["head_dim"] == 128
    assert CONFIGS["glm52"]["kv_lora_rank"] + CONFIGS["glm52"]["qk_rope_head_dim"] == 576
    ratios = CONFIGS["dsv4"]["compress_ratios"]
    assert len(ratios) == CONFIGS["dsv4"]["num_hidden_layers"] + 1  # the MTP layer's, last
    assert ratios[:2] == [0, 0] and set(ratios[2:-1]) == {4, 128}


def test_committed_results_hold_every_field_the_issue_names() -> None:
    data = json.loads(RESULTS.read_text())
    for key in ("device", "driver", "cuda", "torch", "vllm", "date", "doctor_json_ok"):
        assert key in data, key
    assert set(data["launch"]) >= {"ready_s", "bare_ready_s", "ratio", "chat_ok"}
    assert set(data["bench"]["prefill_ratio"]) == {"256", "768", "2048", "8192"}
    for row in data["planner"]:
        assert {"recipe", "tp"} <= set(row)
        assert "error" in row or {"architecture", "vllm_tokens", "plan_tokens", "ratio"} <= set(row)


def test_dummy_site_runs_the_post_load_step_in_a_fresh_process(tmp_path: Path) -> None:
    """The hook patches vLLM's dummy loader as it is imported, in any Python process that has
    the folder on its path (vLLM spawns its workers), and only when asked to."""
    import os
    import subprocess

    package = tmp_path / "vllm" / "model_executor" / "model_loader"
    package.mkdir(parents=True)
    for folder in (tmp_path / "vllm", package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "dummy_loader.py").write_text(
        "class DummyModelLoader:\n"
        "    def load_weights(self, model, model_config):\n"
        "        model.filled = True\n"
    )
    script = (
        "from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader\n"
        "class Inner:\n"
        "    def finalize_mhc_broadcast_weights(self): self.finalized = True\n"
        "class Model:\n"
        "    model = Inner()\n"
        "m = Model(); DummyModelLoader().load_weights(m, None)\n"
        "print(m.filled, getattr(m.model, 'finalized', False))\n"
    )
    site = str(REPO / "benchmarks" / "dummy_site")
    for flag, expected in (("1", "True True"), ("0", "True False")):
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([site, str(tmp_path)]),
            "SM120_DUMMY_POST_LOAD": flag,
        }
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        assert result.stdout.strip() == expected


def test_root_cause_names_the_engine_cores_exception_not_the_api_servers() -> None:
    prefix = "(EngineCore pid=1) ERROR 11-26 01:20:18 [core.py:1330] "
    log = (
        f"{prefix}Traceback (most recent call last):\n"
        f"{prefix}ImportError: tilelang is required\n"
        "(APIServer pid=2) RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert gpu_proof.root_cause(log) == "ImportError: tilelang is required"
    assertion = (
        f"{prefix}    assert self.hc_attn_fn_broadcast is not None\n"
        f"{prefix}           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f"{prefix}AssertionError\n"
    )
    assert gpu_proof.root_cause(assertion) == (
        "AssertionError: assert self.hc_attn_fn_broadcast is not None"
    )
    assert gpu_proof.root_cause("just a line\n") == "just a line"


def bench_part(decode_ratio: float) -> dict[str, object]:
    point = {"ratio": decode_ratio, "interval90": [0.9, 1.1]}
    lengths = {n: point for n in ("256", "768", "2048", "8192")}
    return {
        "rounds": 4,
        "decode_ratio": decode_ratio,
        "prefill_ratio": {n: decode_ratio for n in lengths},
        "detail": {"decode": point, "prefill": lengths, "median_ttft": lengths},
    }


def test_merge_takes_the_later_launch_and_bench_and_summarises_a_doctor_p2p_document(
    tmp_path: Path,
) -> None:
    first = tmp_path / "first.json"
    later = tmp_path / "later.json"
    ready = {"ready_s": 43.0, "bare_ready_s": 40.5}
    first.write_text(
        json.dumps(
            {
                "label": "a",
                "launch": {"ratio": 1.2, "pairs": 2, **ready},
                "bench": bench_part(0.91),
            }
        )
    )
    later.write_text(
        json.dumps(
            {
                "label": "b",
                "machine": "1x NVIDIA H100",
                "launch": {"ratio": 1.06, "pairs": 3, **ready},
                "bench": bench_part(0.97),
            }
        )
    )
    probe = REPO / "benchmarks" / "results" / "gpu-proof-runs" / "doctor-p2p-4xh200.json"
    gpu_proof.merge([first, later, probe], tmp_path / "out")
    merged = json.loads((tmp_path / "out" / "gpu-proof.json").read_text())
    assert merged["launch"]["ratio"] == 1.06
    assert [run["label"] for run in merged["runs"]] == ["a", "b"]
    # The launch figure names the run, and the run its machine: parts come from several cards.
    assert merged["launch"]["run"] == "b"
    assert merged["runs"][1]["device"] == "1x NVIDIA H100"
    assert "machine" not in merged
    assert "median of 3 pairs (b)" in (tmp_path / "out" / "gpu-proof.md").read_text()
    # The bench too: sm120 bench's prompts changed, and the figure is the latest tool's.
    assert (merged["bench"]["decode_ratio"], merged["bench"]["run"]) == (0.97, "b")
    assert "(4 rounds (b), model tiny" in (tmp_path / "out" / "gpu-proof.md").read_text()
    (summary,) = merged["doctor_p2p"]
    assert summary["gpus"] == 4 and summary["all_reduce_ok"]
    assert (summary["pairs_verified"], summary["pairs"]) == (12, 12)
    assert 300 < summary["gbps_range"][0] <= summary["gbps_range"][1]
    assert "12 of 12 peer copies verified" in (tmp_path / "out" / "gpu-proof.md").read_text()


def test_request_pairs_outlive_a_later_bench_without_them(tmp_path: Path) -> None:
    pairs = {
        "256": {
            "pairs": 60,
            "median_ttft_s": {"sm120": 0.0306, "vllm": 0.0313},
            "ratio_of_medians": 0.977,
            "median_pair_ratio": 0.973,
        }
    }
    with_pairs = tmp_path / "23.json"
    later = tmp_path / "22.json"
    positions = {"ttft_ms_by_position": {"vllm": {"256": [[30.0]]}, "sm120": {"256": [[21.0]]}}}
    with_pairs.write_text(
        json.dumps(
            {"label": "pairs", "bench": {**bench_part(1.0), **positions, "request_pairs": pairs}}
        )
    )
    later.write_text(json.dumps({"label": "rounds", "bench": {**bench_part(0.999), **positions}}))
    gpu_proof.merge([with_pairs, later], tmp_path / "out")
    merged = json.loads((tmp_path / "out" / "gpu-proof.json").read_text())
    assert (merged["bench"]["decode_ratio"], merged["bench"]["run"]) == (0.999, "rounds")
    assert merged["request_pairs"]["run"] == "pairs"
    assert merged["request_pairs"]["256"]["ratio_of_medians"] == 0.977
    # per-request TTFTs stay in each run's own file
    assert "ttft_ms_by_position" not in merged["bench"]
    assert "request_pairs" not in merged["bench"]
    table = (tmp_path / "out" / "gpu-proof.md").read_text()
    assert "| 256 tokens | 60 | 30.60 / 31.30 ms | 0.977 | 0.973 |" in table
    # the runner now writes them beside the bench; a later run's pairs replace the earlier
    newer = tmp_path / "24.json"
    newer.write_text(json.dumps({"label": "newer", "request_pairs": {"256": {**pairs["256"]}}}))
    gpu_proof.merge([with_pairs, later, newer], tmp_path / "out")
    merged = json.loads((tmp_path / "out" / "gpu-proof.json").read_text())
    assert merged["request_pairs"]["run"] == "newer"


def merged_probe_table(tmp_path: Path, summary: dict[str, object]) -> str:
    """The Markdown table --merge writes for a run holding only this probe summary."""
    part = tmp_path / "probe.json"
    part.write_text(json.dumps({"label": "probe", "short_ttft_probe": summary}))
    gpu_proof.merge([part], tmp_path / "out")
    return (tmp_path / "out" / "gpu-proof.md").read_text()


def test_the_short_prompt_probe_is_summarised_against_ours_and_merged(tmp_path: Path) -> None:
    import short_ttft_probe

    def one_round(ours: float, vllm: float) -> dict[str, object]:
        values = {"ours": ours, "ours-in-vllm": vllm, "ours-beside": ours, "vllm": vllm}
        return {c: {"ttfts_ms": {"256": [v, v + 2.0, v - 2.0]}} for c, v in values.items()}

    summary = short_ttft_probe.summarize([one_round(21.0, 33.0), one_round(23.0, 35.0)], (256,))
    row = summary["256"]
    assert row["ours"]["per_round_ms"] == [21.0, 23.0]
    assert (row["ours"]["median_ms"], row["vllm"]["median_ms"]) == (22.0, 34.0)
    assert row["vllm"]["ratio_to_ours"] == round(34.0 / 22.0, 3)
    table = merged_probe_table(tmp_path, summary)
    assert "| short-prompt probe (probe), median TTFT | ours | ours-in-vllm |" in table
    assert "| 256 tokens | 22.0 ms (x1.0) | 34.0 ms (x1.545) |" in table


def test_the_probe_summarises_the_conditions_it_ran_and_their_gpu_clocks(tmp_path: Path) -> None:
    import short_ttft_probe

    def one_round(ours: float, phased: float, mhz: float) -> dict[str, object]:
        return {
            condition: {"ttfts_ms": {"256": [ttft]}, "gpu": {"sm_mhz_median": mhz + step}}
            for step, (condition, ttft) in enumerate({"ours": ours, "ours-phased": phased}.items())
        }

    rounds = [one_round(21.0, 33.0, 1900.0), one_round(23.0, 31.0, 1700.0)]
    summary = short_ttft_probe.summarize(rounds, (256,))
    assert set(summary["256"]) == {"ours", "ours-phased"}
    assert summary["256"]["ours-phased"]["ratio_to_ours"] == round(32.0 / 22.0, 3)
    assert summary["sm_mhz"] == {"ours": 1800.0, "ours-phased": 1801.0}
    table = merged_probe_table(tmp_path, summary)
    assert "| short-prompt probe (probe), median TTFT | ours | ours-phased |" in table
    assert "| 256 tokens | 22.0 ms (x1.0) | 32.0 ms (x1.455) |" in table
    assert "| GPU SM clock | 1800 MHz | 1801 MHz |" in table


def test_the_probe_refuses_conditions_it_does_not_know_or_a_run_without_ours() -> None:
    import subprocess
    import sys

    probe = REPO / "benchmarks" / "short_ttft_probe.py"
    for conditions, named in (("ours,vllm-fast", "['vllm-fast']"), ("vllm", "none")):
        argv = [sys.executable, str(probe), "--vllm-python", sys.executable]
        done = subprocess.run(
            [*argv, "--conditions", conditions], capture_output=True, text=True, check=False
        )
        assert done.returncode != 0
        assert f"unknown {named}; name 'ours'" in done.stderr


def test_the_bench_deployment_captures_cuda_graphs_for_the_short_prefills(
    tmp_path: Path,
) -> None:
    """Run 25: with the recipe's 16 sequences vLLM captured graphs only up to 32 tokens and the
    short prefills were launched kernel by kernel; the bench's plan must carry the larger size
    through `sm120 launch`'s own rendering to vLLM's flag."""
    from typer.testing import CliRunner

    from sm120.cli.app import app

    argv = gpu_proof.launch_args(tmp_path / "model", 8123, gpu_proof.BENCH_SETS)
    shown = CliRunner().invoke(app, [*argv, "--dry-run", "--json"])
    assert shown.exit_code == 0, shown.output
    engine_argv = json.loads(shown.output)["argv"]
    flag = engine_argv.index("--compilation-config")
    assert json.loads(engine_argv[flag + 1]) == {"max_cudagraph_capture_size": 1024}
    assert engine_argv[engine_argv.index("--max-num-batched-tokens") + 1] == "16384"


def test_a_launch_gap_run_becomes_the_merged_launch_figure(tmp_path: Path) -> None:
    import launch_gap

    runs = REPO / "benchmarks" / "results" / "gpu-proof-runs"
    rows = json.loads((runs / "20-h100-launch-gap.json").read_text())
    part = launch_gap.proof_part(rows, "gap", "1x NVIDIA H100 80GB HBM3")
    launch = part["launch"]
    assert launch["sides"]["sm120"]["samples_s"] == [45.47, 38.99, 41.7]
    assert (launch["ready_s"], launch["bare_ready_s"], launch["ratio"]) == (41.7, 39.89, 1.045)
    older = {"label": "old", "machine": "m", "steps": {"launch": "ok"}, "launch": {"ratio": 2.0}}
    (tmp_path / "old.json").write_text(json.dumps(older))
    (tmp_path / "gap.json").write_text(json.dumps(part))
    gpu_proof.merge([tmp_path / "old.json", tmp_path / "gap.json"], tmp_path / "out")
    merged = json.loads((tmp_path / "out" / "gpu-proof.json").read_text())
    assert merged["launch"]["ratio"] == 1.045 and merged["launch"]["run"] == "gap"
    assert json.loads(RESULTS.read_text())["launch"]["ratio"] == launch["ratio"]


def test_the_process_tree_names_each_process_its_start_and_cpu() -> None:
    import subprocess
    import time

    import bare_engine

    began = time.time()
    parent = subprocess.Popen(
        ["bash", "-c", "sleep 30 & sum=0; while [ $sum -lt 1 ]; do :; done"],
        start_new_session=True,
    )
    try:
        time.sleep(1.0)
        tree = bare_engine.process_tree(parent.pid)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the sleep too: nothing outlives the test
        parent.wait()
    assert [process["name"] for process in tree] == ["bash", "sleep"]
    shell = tree[0]
    assert shell["cpu_s"] > 0.3  # the busy loop ran for about a second
    assert began - 0.1 <= shell["started_at"] <= began + 1.0
    assert {"runqueue_wait_s", "voluntary_ctxt_switches", "threads"} <= set(shell)
