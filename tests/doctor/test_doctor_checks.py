"""Each doctor check with injected inputs: snapshots (many from the captured corpus),
engine facts, a fake command runner, fake disk usage. No check touches the machine here."""

from __future__ import annotations

import json
import socket
import subprocess
from collections import namedtuple
from collections.abc import Sequence
from pathlib import Path

import pytest

from sm120.doctor import checks, host_checks
from sm120.doctor.capture import parse_text
from sm120.doctor.engine_probe import EngineInfo
from sm120.doctor.findings import Finding
from sm120.doctor.gpu_source import GpuProbe
from sm120.doctor.needs import Needs, needs_from_plan
from sm120.doctor.runner import RunResult
from sm120.doctor.snapshot import GpuInfo, GpuProcess, Snapshot, Topology
from sm120.plan.resolve import PlanRequest, resolve
from tests.fakes.gpu_box import rtx
from tests.helpers import DATA_DIR

CORPUS = DATA_DIR / "nvidia_smi"
DOCKER = DATA_DIR / "docker"
Usage = namedtuple("Usage", "total used free")
GB = 10**9
GIB = 1024**3


def captured(name: str) -> Snapshot:
    return parse_text((CORPUS / name).read_text())


def needs(recipe: str, *sets: str, variants: tuple[str, ...] = ()) -> Needs:
    return needs_from_plan(resolve(PlanRequest(recipe=recipe, variants=variants, sets=sets)))


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


# --- driver ------------------------------------------------------------------------------


def test_no_driver_without_a_recipe_is_a_warning() -> None:
    finding = only(
        checks.check_driver(GpuProbe("no-driver", detail="nvidia-smi is not on PATH"), Needs())
    )
    assert finding.severity == "warn"
    assert finding.message == "no NVIDIA GPU found: nvidia-smi is not on PATH, NVML not available"
    assert "sm120 launch tiny" in finding.remediation


def test_no_driver_blocks_a_gpu_recipe() -> None:
    finding = only(
        checks.check_driver(
            GpuProbe("no-driver", detail="nvidia-smi is not on PATH"), needs("glm52")
        )
    )
    assert finding.severity == "error"
    assert finding.message.endswith("; glm52 needs 4 GPU(s)")


def test_no_driver_is_fine_for_the_cpu_recipe() -> None:
    probe = GpuProbe("no-driver", detail="nvidia-smi is not on PATH")
    assert only(checks.check_driver(probe, needs("tiny"))).severity == "info"


def test_a_driver_that_does_not_answer_blocks() -> None:
    detail = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    finding = only(checks.check_driver(GpuProbe("driver-error", detail=detail), Needs()))
    assert finding.severity == "error"
    assert finding.message == f"the NVIDIA driver does not answer: {detail}"
    assert "reboot" in finding.remediation


def test_driver_ok_names_versions_and_source() -> None:
    probe = GpuProbe("ok", captured("rtx_5090_2x_610_kmd_table.txt"))
    finding = only(checks.check_driver(probe, Needs()))
    assert finding.severity == "ok"
    assert finding.message == (
        "NVIDIA driver 610.57.04, CUDA 13.3 (2 GPU(s), read from the captured output)"
    )


# --- GPUs and the driver's CUDA ----------------------------------------------------------


def test_sm120_gpus_are_ok_and_described() -> None:
    findings = checks.check_gpus(captured("rtx_pro_6000_maxq_580_table.txt"), Needs())
    finding = only(findings)
    assert finding.id == "gpu0" and finding.severity == "ok"
    assert finding.message == (
        "GPU0: NVIDIA RTX PRO 6000 Blac..., sm_120 (from the name), 97,887 MiB total, "
        "3,397 MiB free, edition: Max-Q (from its 325 W power cap)"
    )
    assert finding.data["arch"] == "sm_120" and finding.data["arch_source"] == "name"


def test_other_architectures_warn_against_the_recipe() -> None:
    findings = checks.check_gpus(captured("h100_550_table.txt"), needs("glm52"))
    by_id = {f.id: f for f in findings}
    assert by_id["gpu0"].severity == "warn"
    assert by_id["gpu0"].message.endswith(": glm52 is validated on sm_120")
    assert "--force S06" in by_id["gpu0"].remediation
    assert by_id["gpu-count"].severity == "error"
    assert by_id["gpu-count"].message == "glm52 uses 4 GPUs, this machine shows 2"


def test_gb10_suits_a_recipe_validated_on_sm121() -> None:
    findings = checks.check_gpus(
        # dsv4's seed configuration is the one validated on GB10 (the default is SM120 only)
        captured("gb10_580_table.txt"),
        needs("dsv4", "tensor-parallel-size=1", variants=("seed",)),
    )
    finding = only(findings)
    assert finding.severity == "ok"
    assert "sm_121 (from the name)" in finding.message
    assert "unified memory (not reported)" in finding.message


def test_mig_enabled_gpu_warns() -> None:
    findings = checks.check_gpus(captured("a800_mig_enabled_535_table.txt"), Needs())
    mig = next(f for f in findings if f.id == "gpu0-mig")
    assert mig.severity == "warn"
    assert "nvidia-smi -i 0 -mig 0" in mig.remediation


def test_unknown_gpu_name_is_info() -> None:
    snap = Snapshot(source="captured", gpus=[GpuInfo(index=0, name="NVIDIA Mystery 9000")])
    assert only(checks.check_gpus(snap, Needs())).severity == "info"


def test_old_cuda_driver_blocks_sm120() -> None:
    snap = Snapshot(source="captured", cuda_version="12.4", gpus=[rtx(0)])
    finding = only(checks.check_cuda_driver(snap, Needs()))
    assert finding.severity == "error"
    assert finding.message == ("the driver supports CUDA 12.4; SM120/SM121 GPUs need 12.8 or newer")


def test_cuda_driver_checks_only_matter_for_sm12x() -> None:
    assert checks.check_cuda_driver(captured("h100_550_table.txt"), Needs()) == []
    assert only(checks.check_cuda_driver(captured("gb10_580_table.txt"), Needs())).severity == "ok"
    unknown = Snapshot(source="captured", gpus=[rtx(0)])
    assert only(checks.check_cuda_driver(unknown, Needs())).severity == "info"


# --- memory and processes (F18) ----------------------------------------------------------


def test_f18_a_nearly_full_gpu_blocks_a_recipe() -> None:
    snap = captured("rtx_pro_6000_maxq_580_table.txt")
    finding = only(checks.check_gpu_memory(snap, needs("dsv4", "tensor-parallel-size=1")))
    assert finding.severity == "error" and finding.failure == "F18"
    assert finding.message == (
        "GPU0 has 3,397 MiB free of 97,887 MiB; dsv4 asks vLLM for 98% (95,439 MiB)"
    )
    assert finding.remediation == "find the holder with 'nvidia-smi' (Processes) and stop it"


def test_f18_names_the_holders_with_their_commands() -> None:
    snap = Snapshot(
        source="nvidia-smi",
        gpus=[rtx(0, used=85000), rtx(1, used=400)],
        processes=[
            GpuProcess(
                0,
                4321,
                "python3",
                84500,
                "C",
                command="python3 -m vllm.entrypoints.openai.api_server --port 8000",
            ),
            GpuProcess(0, 2266, "/usr/lib/xorg/Xorg", 4, "G"),
        ],
        processes_listed=True,
    )
    findings = checks.check_gpu_memory(snap, needs("dsv4"))
    assert [f.severity for f in findings] == ["error", "ok"]
    assert findings[0].remediation == (
        "stop what holds it: pid 4321 on GPU0, 84,500 MiB: "
        "python3 -m vllm.entrypoints.openai.api_server --port 8000"
    )
    assert findings[1].message == "GPU1: 97,487 MiB free, enough for 98% of 97,887 MiB"


def test_f18_memory_held_by_processes_this_view_cannot_see() -> None:
    snap = Snapshot(source="nvidia-smi", gpus=[rtx(0, used=60000)], processes_listed=False)
    finding = only(checks.check_gpu_memory(snap, Needs()))
    assert finding.severity == "warn"
    assert finding.message == "GPU0: 60,000 MiB of 97,887 MiB already in use"
    assert finding.remediation.startswith("no process is listed: the memory is held outside")


def test_unified_memory_is_reported_as_such() -> None:
    snap = parse_text(
        (CORPUS / "gb10_580_table.txt").read_text()
        + "\n"
        + (CORPUS / "gb10_csv_na.txt").read_text()
    )
    finding = only(checks.check_gpu_memory(snap, Needs()))
    assert finding.severity == "info"
    assert "unified memory" in finding.message


def test_busy_but_below_threshold_is_ok() -> None:
    finding = only(checks.check_gpu_memory(captured("rtx_pro_6000_600w_580_table.txt"), Needs()))
    assert finding.severity == "ok" and finding.message == "GPU0: 97,873 MiB of 97,887 MiB free"


def test_process_listing() -> None:
    old = captured("gtx_1070_396_old_table.txt")
    finding = only(checks.check_gpu_processes(old))
    assert finding.severity == "warn" and finding.failure == "F18"  # X holds 1,025 MiB
    assert finding.message.startswith("1 process(es) hold 1 GiB or more of GPU memory: ")
    assert "pid 489 on GPU0, 1,025 MiB: /usr/bin/X" in finding.message
    small = Snapshot(source="x", gpus=[rtx(0)], processes=[GpuProcess(0, 7, "Xorg", 4, "G")])
    assert only(checks.check_gpu_processes(small)).severity == "info"
    none = Snapshot(source="x", gpus=[rtx(0)], processes_listed=False)
    assert only(checks.check_gpu_processes(none)).message == "no process holds GPU memory"
    unknown = Snapshot(source="x", gpus=[rtx(0)])
    assert only(checks.check_gpu_processes(unknown)).message == "no process list was available"


# --- interconnect (F10) ------------------------------------------------------------------


def pair(links: dict[str, str], p2p: dict[str, str] | None = None) -> Snapshot:
    return Snapshot(
        source="x",
        gpus=[rtx(0), rtx(1)],
        topology=Topology(devices=["GPU0", "GPU1"], links=links),
        p2p=p2p,
    )


def test_f10_pcie_without_p2p_disable_warns() -> None:
    finding = only(checks.check_interconnect(pair({"GPU0-GPU1": "PHB"}), needs("glm47"), {}))
    assert finding.severity == "warn" and finding.failure == "F10"
    assert finding.message == (
        "PCIe only (GPU0-GPU1 PHB): NCCL's P2P transport hangs at init on many PCIe "
        "workstations (ACS / IOMMU)"
    )
    assert finding.remediation.startswith("set NCCL_P2P_DISABLE=1 (--set env.NCCL_P2P_DISABLE=1)")


def test_f10_driver_reporting_p2p_ok_is_the_risky_case() -> None:
    snap = pair({"GPU0-GPU1": "PHB"}, {"GPU0-GPU1": "OK"})
    finding = only(checks.check_interconnect(snap, Needs(), {}))
    assert finding.severity == "warn"
    assert "the driver reports P2P OK, but NCCL's P2P transport hangs" in finding.message


def test_f10_settled_by_the_plan_or_the_environment() -> None:
    snap = pair({"GPU0-GPU1": "NODE"})
    assert only(checks.check_interconnect(snap, needs("glm52"), {})).severity == "ok"
    from_env = only(checks.check_interconnect(snap, Needs(), {"NCCL_P2P_DISABLE": "1"}))
    assert from_env.message == "PCIe only (GPU0-GPU1 NODE); NCCL_P2P_DISABLE=1 is set"


def test_no_driver_p2p_means_no_p2p_hang() -> None:
    topo = captured("rtx_pro_6000_2x_topo_phb.txt").topology
    p2p = captured("rtx_5090_2x_p2p_tabs.txt").p2p
    snap = Snapshot(source="x", gpus=[rtx(0), rtx(1)], topology=topo, p2p=p2p)
    finding = only(checks.check_interconnect(snap, Needs(), {}))
    assert finding.severity == "info"
    assert "grants no GPU peer-to-peer (GNS)" in finding.message


def test_nvlink_and_mixed() -> None:
    dgx = captured("h100_dgx_8x_topo_nv18_tabs.txt")
    dgx.gpus = [rtx(i) for i in range(8)]
    nvlink = only(checks.check_interconnect(dgx, Needs(), {}))
    assert nvlink.severity == "ok"
    assert nvlink.message == "NVLink between all GPUs (28 GPU pairs: NV18 x28)"
    mixed = Snapshot(
        source="x",
        gpus=[rtx(0), rtx(1), rtx(2)],
        topology=Topology(links={"GPU0-GPU1": "NV4", "GPU0-GPU2": "SYS", "GPU1-GPU2": "SYS"}),
    )
    mixed_finding = only(checks.check_interconnect(mixed, Needs(), {}))
    assert mixed_finding.severity == "warn"
    assert mixed_finding.message == (
        "NVLink between some GPU pairs only (GPU0-GPU1 NV4, GPU0-GPU2 SYS, GPU1-GPU2 SYS)"
    )


def test_interconnect_is_not_a_question_for_one_gpu() -> None:
    assert checks.check_interconnect(captured("gb10_580_table.txt"), Needs(), {}) == []
    one_gpu_plan = needs("dsv4", "tensor-parallel-size=1")
    finding = only(checks.check_interconnect(pair({"GPU0-GPU1": "PHB"}), one_gpu_plan, {}))
    assert finding.severity == "info" and finding.message == "dsv4 uses one GPU: no GPU traffic"
    unknown = Snapshot(source="x", gpus=[rtx(0), rtx(1)])
    assert only(checks.check_interconnect(unknown, Needs(), {})).severity == "info"


# --- engine and torch --------------------------------------------------------------------


def engine(torch: str | None, cuda: str | None, **packages: str) -> EngineInfo:
    pkgs = {"vllm": "0.20.0", **packages}
    if torch:
        pkgs["torch"] = torch
    return EngineInfo("/opt/engine/bin/python", "3.12.3", pkgs, torch, cuda)


def test_engine_findings() -> None:
    assert only(host_checks.check_engine(None, Needs())).severity == "info"
    broken = EngineInfo("/nope/python", error="/nope/python: command not found")
    finding = only(host_checks.check_engine(broken, needs("glm52")))
    assert finding.severity == "error"
    assert (
        finding.message
        == "the engine Python /nope/python did not run: /nope/python: command not found"
    )
    no_vllm = EngineInfo("/usr/bin/python3", "3.11.2", {})
    assert only(host_checks.check_engine(no_vllm, needs("glm52"))).message == (
        "vLLM is not installed in /usr/bin/python3"
    )
    ok = only(host_checks.check_engine(engine("2.9.0+cu128", "12.8"), Needs()))
    assert ok.message == "engine Python /opt/engine/bin/python (Python 3.12.3): vllm 0.20.0"


def test_torch_cpu_build_cannot_drive_gpus() -> None:
    finding = only(host_checks.check_torch(engine("2.13.0+cpu", None), None, needs("glm52")))
    assert finding.severity == "error"
    assert finding.message == (
        "torch 2.13.0+cpu in /opt/engine/bin/python is a CPU build: it cannot use the GPUs"
    )
    assert (
        only(host_checks.check_torch(engine("2.13.0+cpu", None), None, needs("tiny"))).severity
        == "ok"
    )


@pytest.mark.parametrize(
    ("torch", "cuda", "severity", "says"),
    [
        ("2.6.0+cu126", "12.6", "error", "predates SM120 support (2.7 is the first)"),
        ("2.7.0+cu126", "12.6", "error", "built with CUDA 12.6, which has no SM120 kernels"),
        ("2.7.0+cu128", "12.8", "ok", "has SM120 kernels"),
        ("2.11.0+cu130", "13.0", "ok", "has SM120 kernels"),
    ],
)
def test_torch_for_sm120(torch: str, cuda: str, severity: str, says: str) -> None:
    snap = Snapshot(source="x", gpus=[rtx(0)])
    finding = only(host_checks.check_torch(engine(torch, cuda), snap, Needs()))
    assert finding.severity == severity and says in finding.message


def test_torch_missing_and_other_gpus() -> None:
    missing = EngineInfo("/usr/bin/python3", "3.11.2", {})
    assert only(host_checks.check_torch(missing, None, needs("glm52"))).message == (
        "torch is not installed in /usr/bin/python3"
    )
    h100 = captured("h100_550_table.txt")
    assert (
        only(host_checks.check_torch(engine("2.6.0+cu124", "12.4"), h100, Needs())).severity == "ok"
    )


# --- Docker and the NVIDIA runtime -------------------------------------------------------


class FakeRunner:
    def __init__(self, answers: dict[str, RunResult]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> RunResult:
        self.calls.append(list(argv))
        for prefix, answer in self.answers.items():
            if " ".join(argv).startswith(prefix):
                return answer
        return RunResult(127, "", f"{argv[0]}: command not found")


def real_docker_info(name: str) -> str:
    return (DOCKER / name).read_text().strip()


def test_docker_missing_down_denied_and_up() -> None:
    missing = host_checks.probe_docker(FakeRunner({}))
    assert only(host_checks.check_docker(missing)).remediation.startswith("install Docker Engine")
    down = host_checks.probe_docker(
        FakeRunner(
            {
                "docker info": RunResult(
                    1,
                    "null\n",
                    "Cannot connect to the Docker daemon at "
                    "unix:///var/run/docker.sock. Is the docker daemon running?\n",
                )
            }
        )
    )
    finding = only(host_checks.check_docker(down))
    assert finding.severity == "warn"
    assert finding.message.startswith(
        "Docker engine not reachable: Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    )
    assert finding.remediation == "start the engine: sudo systemctl start docker"
    denied = host_checks.probe_docker(
        FakeRunner(
            {
                "docker info": RunResult(
                    1, "", "permission denied while trying to connect to the Docker daemon socket"
                )
            }
        )
    )
    assert "usermod -aG docker" in only(host_checks.check_docker(denied)).remediation
    up = host_checks.probe_docker(
        FakeRunner({"docker info": RunResult(0, real_docker_info("info_runc_only.json"))})
    )
    assert only(host_checks.check_docker(up)).message == "Docker engine 20.10.24+dfsg1 reachable"


def test_nvidia_runtime_from_real_engine_answers() -> None:
    registered = host_checks.probe_docker(
        FakeRunner({"docker info": RunResult(0, real_docker_info("info_nvidia_runtime.json"))})
    )
    finding = only(host_checks.check_container_runtime(registered, lambda _name: None))
    assert finding.severity == "ok"
    assert finding.message == "NVIDIA container runtime registered (default: runc)"
    plain = host_checks.probe_docker(
        FakeRunner({"docker info": RunResult(0, real_docker_info("info_runc_only.json"))})
    )
    missing = only(host_checks.check_container_runtime(plain, lambda _name: None))
    assert missing.severity == "warn"
    assert missing.message == (
        "no NVIDIA container runtime: containers will not see the GPUs (runtimes: "
        "io.containerd.runc.v2, io.containerd.runtime.v1.linux, runc)"
    )
    toolkit = only(host_checks.check_container_runtime(plain, lambda name: f"/usr/bin/{name}"))
    assert toolkit.remediation.startswith("sudo nvidia-ctk runtime configure --runtime=docker")


def test_nvidia_gpus_through_cdi(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    info = json.loads(real_docker_info("info_runc_only.json"))
    info["CDISpecDirs"] = [str(tmp_path)]
    state = host_checks.DockerState(True, info=info)
    finding = only(host_checks.check_container_runtime(state, lambda _name: None))
    assert finding.severity == "ok" and "through CDI" in finding.message


def test_runtime_not_checked_without_docker() -> None:
    state = host_checks.DockerState(False, detail="docker is not installed")
    assert only(host_checks.check_container_runtime(state, lambda _name: None)).severity == "info"


# --- disk, shm, port, memory -------------------------------------------------------------


def disk(free_gb: float):  # type: ignore[no-untyped-def]
    return lambda _path: Usage(10**13, 0, int(free_gb * GB))


def test_disk_too_small_for_the_weights(tmp_path: Path) -> None:
    finding = only(
        host_checks.check_disk(tmp_path / "glm52", needs("glm52"), 0, disk(120), label="model dir")
    )
    assert finding.severity == "error"
    assert (
        finding.message
        == f"glm52 needs 313 GB more at {tmp_path / 'glm52'} (model dir); 120 GB free"
    )


def test_disk_counts_what_is_already_there(tmp_path: Path) -> None:
    present = 300 * GB
    ok = only(
        host_checks.check_disk(tmp_path, needs("glm52"), present, disk(100), label="model dir")
    )
    assert ok.severity == "ok"
    assert (
        ok.message
        == f"100 GB free at {tmp_path} (model dir); glm52 needs 13 GB more (300 GB already there)"
    )
    tight = only(host_checks.check_disk(tmp_path, needs("glm52"), 0, disk(320), label="model dir"))
    assert tight.severity == "warn"
    done = only(
        host_checks.check_disk(tmp_path, needs("glm52"), 313 * GB, disk(1), label="model dir")
    )
    assert done.severity == "ok" and "are at" in done.message
    nothing = only(
        host_checks.check_disk(tmp_path, Needs(), 0, disk(55), label="Hugging Face cache")
    )
    assert nothing.severity == "info" and nothing.message.startswith("55 GB free at ")


def test_disk_usage_is_taken_where_the_path_will_be(tmp_path: Path) -> None:
    asked: list[str] = []

    def usage(path: str) -> Usage:
        asked.append(path)
        return Usage(0, 0, 10**12)

    host_checks.check_disk(tmp_path / "a" / "b", needs("glm52"), 0, usage, label="model dir")
    assert asked == [str(tmp_path)]


def test_shm() -> None:
    small = only(
        host_checks.check_shm("/dev/shm", needs("glm52"), lambda _p: Usage(64 * 1024**2, 0, 0))
    )
    assert small.severity == "warn"
    assert small.message == "/dev/shm is 0.1 GiB; NCCL across GPUs wants 32 GiB"

    def gone(_path: str) -> Usage:
        raise FileNotFoundError(_path)

    assert only(host_checks.check_shm("/dev/shm", Needs(), gone)).severity == "warn"
    ok = only(host_checks.check_shm("/dev/shm", Needs(), lambda _p: Usage(24 * GIB, 0, 0)))
    assert ok.severity == "ok" and ok.message == "/dev/shm is 24.0 GiB"


def test_port_taken_and_free() -> None:
    from sm120.core.ports import ensure_port_free

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = only(host_checks.check_port("127.0.0.1", port, ensure_port_free))
        assert taken.severity == "error"
        assert (
            taken.message == f"port {port} on 127.0.0.1 is already in use (Address already in use)"
        )
        assert taken.remediation.startswith("pick another with --port")
    free = only(host_checks.check_port("127.0.0.1", port, ensure_port_free))
    assert free.severity == "ok" and free.message == f"port {port} on 127.0.0.1 is free"


def test_system_memory() -> None:
    meminfo = "MemTotal:       24683520 kB\nMemFree:         1000 kB\nMemAvailable:   20447232 kB\n"
    finding = only(host_checks.check_system_memory(meminfo))
    assert finding.severity == "ok" and finding.message == "23.5 GiB RAM, 19.5 GiB available"
    low = only(host_checks.check_system_memory("MemTotal: 16384000 kB\nMemAvailable: 4096000 kB\n"))
    assert low.severity == "warn"
    assert only(host_checks.check_system_memory(None)).severity == "info"


def test_a_port_a_stopped_server_left_in_time_wait_is_free() -> None:
    from sm120.core.ports import ensure_port_free

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its side of the connection waits
        client.close()
    lingering = subprocess.run(
        ["ss", "-Htan", "state", "time-wait", f"sport = :{port}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if lingering.returncode == 0:  # ss (iproute2) shows what the test set up
        assert lingering.stdout.strip(), "no TIME_WAIT connection to test against"
    ensure_port_free("127.0.0.1", port)  # as uvicorn would bind it: no error


def test_without_a_recipe_a_gpu_that_is_not_sm12x_is_told_what_runs_on_it() -> None:
    targets = {"sm_90": ("tiny -V gpu",), "sm_120": ("glm52", "tiny -V gpu"), "sm_121": ("dsv4",)}
    findings = checks.check_gpus(captured("h100_550_table.txt"), Needs(targets=targets))
    gpu0 = next(f for f in findings if f.id == "gpu0")
    assert gpu0.severity == "warn"
    assert gpu0.message.endswith(": not SM120/SM121; validated here: tiny -V gpu")
    assert gpu0.remediation == (
        "dsv4, glm52 need SM120/SM121 (NVFP4/MXFP4 kernels and SM12x attention backends) "
        "and refuse this GPU unless --force S06"
    )


def test_without_any_recipe_for_the_arch_the_gpu_is_named_as_such() -> None:
    findings = checks.check_gpus(captured("h100_550_table.txt"), Needs())
    gpu0 = next(f for f in findings if f.id == "gpu0")
    assert gpu0.message.endswith(": not SM120/SM121; no recipe is validated on sm_90")
