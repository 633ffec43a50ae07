"""The doctor as a whole, through its doors: a fake command runner standing in for a GPU
box (answering with captured outputs), a fake NVML module, and the real NVML bindings on
this GPU-less machine; and preflight inside the launcher."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace as replace_machine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sm120.doctor import preflight, run_doctor
from sm120.doctor.gpu_source import probe_gpus, probe_with_nvidia_smi, probe_with_nvml
from sm120.doctor.needs import Needs, needs_from_plan
from sm120.doctor.runner import RunResult, run_command
from sm120.engine.gpu_readings import load_nvml
from sm120.plan.resolve import PlanRequest, resolve
from tests.fakes.gpu_box import CORPUS, FakeRunner, gpu_box, machine
from tests.helpers import free_port


def by_id(findings: list[Any]) -> dict[str, Any]:
    return {f.id: f for f in findings}


def test_a_gpu_box_through_nvidia_smi() -> None:
    run = gpu_box()
    result = run_doctor(Needs(), machine=machine(run))
    snap = result.gpu.snapshot if result.gpu else None
    assert snap is not None and snap.source == "nvidia-smi"
    assert (snap.driver_version, snap.cuda_version) == ("580.105.08", "13.0")
    assert [g.name for g in snap.gpus] == [
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    ] * 2  # the CSV's full names win over the table's cut one
    assert [g.compute_cap for g in snap.gpus] == ["12.0", "12.0"]
    [proc] = snap.processes
    assert (proc.gpu, proc.pid, proc.used_mib) == (0, 4321, 94470)
    assert proc.command == "python3 -m vllm.entrypoints.openai.api_server --port 8001"
    found = by_id(result.findings)
    assert found["driver"].message == (
        "NVIDIA driver 580.105.08, CUDA 13.0 (2 GPU(s), read from nvidia-smi)"
    )
    assert found["gpu0-memory"].severity == "warn"
    assert "pid 4321 on GPU0, 94,470 MiB: python3 -m vllm" in found["gpu0-memory"].remediation
    assert found["gpu1-memory"].severity == "ok"
    assert found["interconnect"].severity == "warn"
    assert "the driver reports P2P OK" in found["interconnect"].message
    assert found["nvidia-runtime"].severity == "ok"
    assert result.ok  # warnings only
    assert "nvidia-smi topo -m" in run.calls


def test_the_same_box_blocks_a_recipe_that_wants_the_memory() -> None:
    needs = needs_from_plan(resolve(PlanRequest(recipe="dsv4", variants=("pr41834",))))
    result = run_doctor(needs, machine=machine(gpu_box()))
    found = by_id(result.findings)
    assert found["gpu0-memory"].severity == "error" and found["gpu0-memory"].failure == "F18"
    assert found["interconnect"].severity == "ok"  # dsv4 -V pr41834 sets NCCL_P2P_DISABLE=1
    assert not result.ok
    assert result.document()["blocking"] == ["gpu0-memory"]


def test_old_drivers_without_compute_cap_get_a_second_query() -> None:
    old_query = (
        "index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], driver_version, "
        "pci.bus_id, uuid\n"
        "0, GeForce GTX 1070, 8114, 1917, 6197, 470.57.02, 00000000:24:00.0, GPU-c\n"
    )
    run = FakeRunner(
        {
            "nvidia-smi --query-gpu=index,name,compute_cap": RunResult(
                2, 'Field "compute_cap" is not a valid field to query.\n'
            ),
            "nvidia-smi --query-gpu=index,name,memory": RunResult(0, old_query),
            "nvidia-smi": RunResult(0, (CORPUS / "gtx_1070_396_old_table.txt").read_text()),
        }
    )
    probe = probe_with_nvidia_smi(run)
    assert probe.status == "ok" and probe.snapshot is not None
    assert [g.name for g in probe.snapshot.gpus] == ["GeForce GTX 1070"]
    assert probe.snapshot.driver_version == "470.57.02"


def test_a_driver_that_fails() -> None:
    message = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
        "sure that the latest NVIDIA driver is installed and running.\n"
    )
    probe = probe_with_nvidia_smi(FakeRunner({"nvidia-smi": RunResult(9, message)}))
    assert probe.status == "driver-error"
    assert probe.detail == message.strip()


# --- NVML --------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[dict[str, Any]], nvlinks: dict[tuple[int, int], str] | None = None) -> Any:
    """The pynvml functions doctor calls, answering from `gpus`."""
    nvlinks = nvlinks or {}

    def handle(i: int) -> dict[str, Any]:
        return gpus[i]

    def memory(h: dict[str, Any]) -> Any:
        if h.get("memory") is None:
            raise NVMLError("Not Supported")
        total, used = h["memory"]
        return SimpleNamespace(total=total * 2**20, used=used * 2**20, free=(total - used) * 2**20)

    def link_state(h: dict[str, Any], link: int) -> int:
        if (h["index"], link) not in nvlinks:
            raise NVMLError("Not Supported")
        return 1

    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlSystemGetCudaDriverVersion=lambda: 13000,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: h["name"].encode(),  # old bindings return bytes
        nvmlDeviceGetCudaComputeCapability=lambda h: h["cc"],
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=h["bus"]),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h['index']}",
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 600000,
        nvmlDeviceGetMigMode=lambda h: (0, 0),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            SimpleNamespace(pid=p, usedGpuMemory=m * 2**20) for p, m in h.get("procs", [])
        ],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlSystemGetProcessName=lambda pid: f"proc{pid}",
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 30,
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: SimpleNamespace(
            busId=nvlinks[(h["index"], link)]
        ),
    )


def test_nvml_gb10() -> None:
    nvml = fake_nvml([{"index": 0, "name": "NVIDIA GB10", "cc": (12, 1), "memory": None,
                       "bus": "0000000F:01:00.0", "procs": [(114687, 19135)]}])  # fmt: skip
    probe = probe_with_nvml(nvml, FakeRunner({}))
    assert probe is not None and probe.status == "ok" and probe.snapshot is not None
    snap = probe.snapshot
    assert (snap.source, snap.driver_version, snap.cuda_version) == ("nvml", "580.95.05", "13.0")
    [gpu] = snap.gpus
    assert (gpu.name, gpu.compute_cap, gpu.memory_reported) == ("NVIDIA GB10", "12.1", False)
    assert gpu.power_limit_w == 600.0
    [proc] = snap.processes
    assert (proc.pid, proc.name, proc.used_mib, proc.type) == (114687, "proc114687", 19135, "C")


def test_nvml_topology_counts_nvlinks_and_falls_back_to_pcie_levels() -> None:
    gpus = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "cc": (9, 0), "memory": (81559, 0),
         "bus": f"00000000:{i + 1:02X}:00.0"}
        for i in range(3)
    ]  # fmt: skip
    links = {(0, 0): "00000000:02:00.0", (0, 1): "00000000:02:00.0", (1, 0): "00000000:01:00.0"}
    probe = probe_with_nvml(fake_nvml(gpus, links), FakeRunner({}))
    assert probe is not None and probe.snapshot is not None
    topo = probe.snapshot.topology
    assert topo is not None
    assert topo.links == {"GPU0-GPU1": "NV2", "GPU0-GPU2": "PHB", "GPU1-GPU2": "PHB"}


def test_nvml_that_cannot_load_hands_over_to_nvidia_smi() -> None:
    def refuse() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    nvml = SimpleNamespace(nvmlInit=refuse)
    probe = probe_gpus(FakeRunner({}), nvml)  # type: ignore[arg-type]
    assert probe.status == "no-driver" and probe.detail == "nvidia-smi is not on PATH"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a driver")
def test_real_nvml_bindings_on_this_gpu_less_machine() -> None:
    nvml = load_nvml()
    assert nvml is not None  # nvidia-ml-py is a dev dependency
    probe = probe_gpus(run_command, nvml)
    assert probe.status == "no-driver"
    assert probe.snapshot is None


# --- preflight ---------------------------------------------------------------------------


def test_preflight_skips_gpu_checks_for_the_cpu_recipe(tmp_path: Path) -> None:
    plan = resolve(PlanRequest(recipe="tiny", model_dir=str(tmp_path)))
    run = FakeRunner({})
    findings = preflight(plan, engine_python=None, machine=machine(run))
    ids = [f.id for f in findings]
    assert "driver" not in ids and "docker" not in ids
    assert not any(call.startswith("nvidia-smi") for call in run.calls)
    assert {"engine", "disk", "shm", "port", "memory"} <= set(ids)


def test_preflight_leaves_arch_and_count_to_the_rules() -> None:
    plan = resolve(PlanRequest(recipe="glm52"))
    h100 = FakeRunner(
        {
            "nvidia-smi --query-gpu": RunResult(
                0,
                "index, name, compute_cap, memory.total [MiB], memory.used [MiB]\n"
                "0, NVIDIA H100 80GB HBM3, 9.0, 81559, 0\n",
            ),
            "nvidia-smi": RunResult(0, (CORPUS / "h100_550_table.txt").read_text()),
        }
    )
    ids = {f.id: f.severity for f in preflight(plan, machine=machine(h100))}
    assert "gpu-count" not in ids and "gpu0" not in ids  # S02 / S06 own those (with --force)
    assert ids["driver"] == "ok"


def test_replacing_a_server_does_not_count_what_that_server_holds() -> None:
    from sm120.core.ports import PortInUse

    def taken(_host: str, port: int) -> None:
        raise PortInUse(f"port {port} on 127.0.0.1 is already in use", "pick another")

    plan = resolve(PlanRequest(recipe="dsv4"))
    box = replace_machine(machine(gpu_box()), ensure_port_free=taken)
    before = {f.id: f.severity for f in preflight(plan, machine=box)}
    assert before["gpu0-memory"] == "error" and before["port"] == "error"
    replacing = {f.id: f.severity for f in preflight(plan, machine=box, replacing=True)}
    assert {"gpu0-memory", "gpu1-memory", "gpu-processes", "port"}.isdisjoint(replacing)
    assert replacing["driver"] == "ok" and "disk" in replacing  # the rest still runs


def test_preflight_stops_a_launch_before_anything_starts(tmp_path: Path) -> None:
    from sm120.deploy.checked import CheckedPlan
    from sm120.deploy.launcher import LaunchError, LaunchOptions, launch
    from sm120.plan.hardware import Hardware

    class NothingMayStart:
        kind = "native"

        def start(self, *args: object) -> None:
            raise AssertionError("the engine must not start")

    plan = resolve(PlanRequest(recipe="tiny", model_dir=str(tmp_path / "tiny"), port=free_port()))
    checked = CheckedPlan(plan, Hardware(0, "cpu", "detected"), [])
    options = LaunchOptions(name="tiny", vllm_python=sys.executable)
    messages: list[str] = []
    with pytest.raises(LaunchError) as caught:
        launch(checked, NothingMayStart(), options, messages.append, lambda *_: None)  # type: ignore[arg-type]
    assert caught.value.one_line() == (
        f"preflight [engine]: vLLM is not installed in {sys.executable} (+1 more) "
        "(hint: install vLLM there, or use 'sm120 engine install' for the CPU build)"
    )
    assert not (tmp_path / "tiny").exists()  # not even the model was generated
