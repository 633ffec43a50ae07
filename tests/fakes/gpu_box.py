"""A GPU box for the doctor without one: a command runner answering with captured
nvidia-smi and docker outputs (a 2x RTX PRO 6000 Max-Q), the machine's files and disk around
it, and single GPUs as nvidia-smi reports them."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence

from sm120.doctor.run import Machine
from sm120.doctor.runner import RunResult
from sm120.doctor.snapshot import GpuInfo
from tests.helpers import DATA_DIR

CORPUS = DATA_DIR / "nvidia_smi"
DOCKER = DATA_DIR / "docker"
Usage = namedtuple("Usage", "total used free")

# A 2x RTX PRO 6000 Max-Q box in the formats nvidia-smi prints (the CSV answers are written
# in the documented query format; the topology is a captured one).
QUERY = (
    "index, name, compute_cap, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
    "driver_version, pci.bus_id, uuid, power.limit [W], mig.mode.current\n"
    "0, NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition, 12.0, 97887, 94490, 3397, "
    "580.105.08, 00000000:41:00.0, GPU-aaaa, 300.00, [N/A]\n"
    "1, NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition, 12.0, 97887, 15, 97872, "
    "580.105.08, 00000000:C1:00.0, GPU-bbbb, 300.00, [N/A]\n"
)
APPS = "gpu_uuid, pid, process_name, used_memory [MiB]\nGPU-aaaa, 4321, python3, 94470\n"
P2P_OK = "        GPU0    GPU1\n GPU0   X       OK\n GPU1   OK      X\n"


class FakeRunner:
    def __init__(self, answers: dict[str, RunResult]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str]) -> RunResult:
        line = " ".join(argv)
        self.calls.append(line)
        for prefix, answer in self.answers.items():
            if line.startswith(prefix):
                return answer
        return RunResult(127, "", f"{argv[0]}: command not found")


def gpu_box(extra: dict[str, RunResult] | None = None) -> FakeRunner:
    return FakeRunner(
        {
            "nvidia-smi --query-gpu": RunResult(0, QUERY),
            "nvidia-smi --query-compute-apps": RunResult(0, APPS),
            "nvidia-smi topo -m": RunResult(
                0, (CORPUS / "rtx_pro_6000_2x_topo_phb.txt").read_text()
            ),
            "nvidia-smi topo -p2p r": RunResult(0, P2P_OK),
            "nvidia-smi": RunResult(0, (CORPUS / "rtx_pro_6000_maxq_580_table.txt").read_text()),
            "docker info": RunResult(0, (DOCKER / "info_nvidia_runtime.json").read_text()),
            **(extra or {}),
        }
    )


def machine(run: FakeRunner, **files: str) -> Machine:
    texts = {
        "/proc/meminfo": "MemTotal: 263000000 kB\nMemAvailable: 250000000 kB\n",
        "/proc/4321/cmdline": (
            "python3\x00-m\x00vllm.entrypoints.openai.api_server\x00--port\x008001\x00"
        ),
        **files,
    }
    return Machine(
        run=run,
        nvml=None,
        environ={},
        read_text=texts.get,
        disk_usage=lambda _path: Usage(4 * 10**12, 0, 2 * 10**12),
        which=lambda _name: None,
        ensure_port_free=lambda _host, _port: None,
    )


def rtx(index: int, used: int = 500, total: int = 97887, name: str | None = None) -> GpuInfo:
    return GpuInfo(
        index=index,
        name=name or "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        compute_cap="12.0",
        memory_total_mib=total,
        memory_used_mib=used,
        memory_free_mib=total - used,
    )
