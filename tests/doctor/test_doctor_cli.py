"""`sm120 doctor` from the command line: the --from JSON contract on captured outputs, exit
codes, one-line errors, the environment report, and the real no-GPU path of this machine."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import DATA_DIR, free_port, invoke

CORPUS = DATA_DIR / "nvidia_smi"
NO_DRIVER = shutil.which("nvidia-smi") is None
needs_no_driver = pytest.mark.skipif(not NO_DRIVER, reason="checks the GPU-less path")


def doctor_json(cli: CliRunner, *args: str) -> tuple[int, dict[str, object]]:
    code, out, err = invoke(cli, "doctor", *args, "--json")
    assert err == "" or not err.startswith("Error"), err
    return code, json.loads(out)


# --- --from ----------------------------------------------------------------------------


def test_from_json_contract_on_a_table(cli: CliRunner) -> None:
    code, doc = doctor_json(cli, "--from", str(CORPUS / "rtx_5090_2x_610_kmd_table.txt"))
    assert code == 0
    assert doc["driver_version"] == "610.57.04"
    assert doc["cuda_version"] == "13.3"
    assert doc["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA GeForce RTX 5090",
            "memory_total_mib": 32607,
            "memory_used_mib": 29428,
            "memory_free_mib": 3179,
            "bus_id": "00000000:01:00.0",
            "power_limit_w": 575.0,
        },
        {
            "index": 1,
            "name": "NVIDIA GeForce RTX 5090",
            "memory_total_mib": 32607,
            "memory_used_mib": 30347,
            "memory_free_mib": 2260,
            "bus_id": "00000000:02:00.0",
            "power_limit_w": 600.0,
        },
    ]
    assert doc["processes"] == []
    assert doc["links"] == {} and doc["nvlink"] is None  # no matrix was given
    assert doc["ok"] is True
    ids = {f["id"]: f["severity"] for f in doc["findings"]}  # type: ignore[union-attr]
    assert ids["gpu0-memory"] == "warn" and ids["gpu1-memory"] == "warn"
    assert ids["interconnect"] == "info"  # two GPUs, no topo -m to judge
    for finding in doc["findings"]:  # type: ignore[union-attr]
        assert set(finding) >= {"id", "severity", "message", "remediation"}


def test_from_json_contract_on_a_matrix(cli: CliRunner) -> None:
    code, doc = doctor_json(cli, "--from", str(CORPUS / "rtx_pro_6000_2x_topo_phb.txt"))
    assert code == 0
    assert doc["links"] == {"GPU0-GPU1": "PHB"}
    assert doc["nvlink"] is False
    assert doc["gpus"] == [] and doc["driver_version"] is None and doc["cuda_version"] is None
    [f10] = [f for f in doc["findings"] if f["id"] == "interconnect"]  # type: ignore[union-attr]
    assert f10["severity"] == "warn" and f10["failure"] == "F10"


def test_from_processes_and_nvlink(cli: CliRunner) -> None:
    _, gb10 = doctor_json(cli, "--from", str(CORPUS / "gb10_csv_na.txt"))
    assert gb10["processes"] == [
        {"gpu": None, "pid": 114687, "name": "/usr/local/bin/python", "used_mib": 19135,
         "gpu_uuid": "GPU-..."}
    ]  # fmt: skip
    _, dgx = doctor_json(cli, "--from", str(CORPUS / "h100_dgx_8x_topo_nv18_tabs.txt"))
    assert dgx["nvlink"] is True
    assert len(dgx["links"]) == 28  # type: ignore[arg-type]
    assert dgx["links"]["GPU3-GPU7"] == "NV18"  # type: ignore[index]


def test_from_a_folder(cli: CliRunner, tmp_path: Path) -> None:
    for name in ("rtx_5090_2x_610_kmd_table.txt", "rtx_5090_2x_p2p_spaces.txt"):
        shutil.copy(CORPUS / name, tmp_path / name)
    code, doc = doctor_json(cli, "--from", str(tmp_path))
    assert code == 0
    assert doc["kinds"] == ["table", "p2p"]
    assert doc["p2p"] == {"GPU0-GPU1": "GNS"}
    assert len(doc["files"]) == 2  # type: ignore[arg-type]
    assert len(doc["gpus"]) == 2  # type: ignore[arg-type]


def test_from_with_a_recipe_that_would_not_fit_exits_1(cli: CliRunner) -> None:
    code, out, _ = invoke(
        cli, "doctor", "dsv4", "--set", "tensor-parallel-size=1",
        "--from", str(CORPUS / "rtx_pro_6000_maxq_580_table.txt"),
    )  # fmt: skip
    assert code == 1
    assert "FAIL  gpu0-memory" in out
    assert "GPU0 has 3,397 MiB free of 97,887 MiB; dsv4 asks vLLM for 98% (95,439 MiB)" in out
    assert "fix (F18):" in out
    assert out.rstrip().endswith("blocked: 1 blocking, 0 warning(s)")


def test_from_text_output(cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "doctor", "--from", str(CORPUS / "gb10_580_table.txt"))
    assert code == 0
    assert out.splitlines()[0] == (
        f"captured outputs from {CORPUS / 'gb10_580_table.txt'} (1 file(s)): table"
    )
    assert "GPU0: NVIDIA GB10, sm_121 (from the name), unified memory (not reported)" in out


def test_from_a_missing_path(cli: CliRunner, tmp_path: Path) -> None:
    code, out, err = invoke(cli, "doctor", "--from", str(tmp_path / "nope.txt"))
    assert code == 2 and out == ""
    assert err == (
        f"Error: --from: {tmp_path / 'nope.txt'} does not exist (hint: pass a file (or a "
        "folder of files) holding pasted nvidia-smi output)\n"
    )


def test_from_text_without_any_output(cli: CliRunner, tmp_path: Path) -> None:
    paste = tmp_path / "bug.txt"
    paste.write_text("vllm hangs after loading, please help\n")
    code, _, err = invoke(cli, "doctor", "--from", str(paste))
    assert code == 2
    assert err == (
        f"Error: no nvidia-smi output recognised in {paste} (hint: paste what 'nvidia-smi', "
        "'nvidia-smi topo -m' or 'nvidia-smi --query-gpu=index,name,compute_cap,memory.total,"
        "memory.used --format=csv' printed)\n"
    )


def test_from_and_report_do_not_mix(cli: CliRunner, tmp_path: Path) -> None:
    code, _, err = invoke(
        cli, "doctor", "--from", str(CORPUS / "gb10_580_table.txt"), "--report", str(tmp_path / "r")
    )
    assert code == 2
    assert err == (
        "Error: --report describes this machine and cannot be combined with --from (hint: run "
        "'sm120 doctor --report FILE' on the machine itself)\n"
    )


def test_report_to_an_unwritable_place(cli: CliRunner, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, err = invoke(
        cli, "doctor", "--port", str(free_port()), "--report", str(blocker / "env.md")
    )
    assert code == 2 and out == ""
    assert err == (
        f"Error: cannot write the environment report to {blocker / 'env.md'} (File exists: "
        f"{blocker}) (hint: pass --report with a writable path)\n"
    )


def test_unknown_recipe(cli: CliRunner) -> None:
    code, _, err = invoke(cli, "doctor", "glm99")
    assert code == 2 and err.startswith("Error: ") and "glm99" in err


# --- the live machine (this one has no GPU) ---------------------------------------------


@needs_no_driver
def test_live_doctor_on_this_gpu_less_machine(cli: CliRunner, isolated_home: Path) -> None:
    code, doc = doctor_json(cli, "--port", str(free_port()))
    assert code == 0
    assert doc["ok"] is True and doc["blocking"] == []
    assert doc["gpu_status"] == "no-driver" and doc["nvidia"] is None
    findings = {f["id"]: f for f in doc["findings"]}  # type: ignore[union-attr]
    assert findings["driver"]["severity"] == "warn"
    assert findings["driver"]["message"] == (
        "no NVIDIA GPU found: nvidia-smi is not on PATH, NVML not available"
    )
    for always in ("engine", "docker", "nvidia-runtime", "disk", "shm", "port", "memory"):
        assert always in findings, always
    assert findings["port"]["severity"] == "ok"
    report = Path(str(doc["report"]))
    assert report == isolated_home / "doctor" / "environment.md"
    text = report.read_text()
    assert text.startswith("# sm120 environment report\n")
    assert "- no GPU: no-driver (nvidia-smi is not on PATH)" in text
    assert "[warn] driver: no NVIDIA GPU found" in text


@needs_no_driver
def test_live_doctor_for_a_gpu_recipe_blocks(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "doctor", "glm52", "--port", str(free_port()))
    assert code == 1
    assert out.splitlines()[0] == "sm120 doctor for glm52"
    assert (
        "FAIL  driver           no NVIDIA GPU found: nvidia-smi is not on PATH, NVML not "
        "available; glm52 needs 4 GPU(s)"
    ) in out
    assert "environment report: " in err


def test_live_doctor_for_the_cpu_recipe(cli: CliRunner, tmp_path: Path) -> None:
    code, doc = doctor_json(
        cli, "tiny", "--port", str(free_port()), "--vllm-python", sys.executable,
        "--report", str(tmp_path / "env.md"),
    )  # fmt: skip
    assert doc["gpu_status"] is None  # the CPU recipe does not ask for a GPU
    assert doc["recipe"] == "tiny"
    engine = {f["id"]: f for f in doc["findings"]}["engine"]  # type: ignore[union-attr]
    # sm120's own venv has no vLLM: for a recipe that is blocking.
    assert engine["severity"] == "error"
    assert engine["message"] == f"vLLM is not installed in {sys.executable}"
    assert code == 1
    assert (tmp_path / "env.md").read_text().count(f"- python: {sys.executable}") == 1


def test_live_doctor_with_a_taken_port(cli: CliRunner) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, doc = doctor_json(cli, "--port", str(port))
    assert code == 1
    assert doc["blocking"] == ["port"]


def test_report_hides_secrets(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    report = tmp_path / "report.md"
    invoke(cli, "doctor", "--port", str(free_port()), "--report", str(report))
    text = report.read_text()
    assert "HF_TOKEN=(set, value hidden)" in text
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in text
    assert "NCCL_P2P_DISABLE=1" in text


# --- launch runs the preflight -------------------------------------------------------------


@needs_no_driver
def test_launch_of_a_gpu_recipe_stops_at_preflight(cli: CliRunner, isolated_home: Path) -> None:
    port = free_port()
    code, _, err = invoke(
        cli, "launch", "glm52", "--force", "S02", "--force", "S06", "--port", str(port),
        "--vllm-python", sys.executable,
    )  # fmt: skip
    assert code == 2
    last = err.splitlines()[-1]
    # The engine, torch and (with less than 313 GB free) disk findings block too: "+N more".
    assert last.startswith(
        "Error: preflight [driver]: no NVIDIA GPU found: nvidia-smi is not on PATH, NVML not "
        "available; glm52 needs 4 GPU(s) (+"
    )
    assert last.endswith(
        " more) (hint: install the NVIDIA driver (570 or newer for SM120) and check that "
        "'nvidia-smi' works; without a GPU only the CPU recipe (sm120 launch tiny) runs here)"
    )
    assert not (isolated_home / "deployments" / "glm52" / "state.json").exists()
