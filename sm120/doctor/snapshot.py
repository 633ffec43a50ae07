"""What is known about a machine's GPUs, from whichever source said it: NVML, a live
`nvidia-smi`, or outputs pasted into a bug report. Fields stay None when the source did not
show them, so a report never claims more than it saw."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class GpuInfo:
    index: int | None = None
    name: str | None = None
    # The default table cuts long names ("NVIDIA RTX PRO 6000 Blac..."); CSV and NVML do not.
    name_truncated: bool = False
    compute_cap: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    # GB10's unified memory reads "Not Supported" / "[N/A]": a fact worth keeping.
    memory_reported: bool = True
    bus_id: str | None = None
    uuid: str | None = None
    power_limit_w: float | None = None
    mig: bool | None = None
    # The PCIe link as the driver sees it now and at most (nvidia-smi pcie.link.*, -q "GPU
    # Link Info"): an idle GPU lowers its generation to save power, its width stays.
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None

    def merge(self, other: GpuInfo) -> None:
        """Fill what this one lacks from another view of the same GPU (full names win)."""
        if other.name and (self.name is None or (self.name_truncated and not other.name_truncated)):
            self.name, self.name_truncated = other.name, other.name_truncated
        for item in fields(self):
            if item.name in ("name", "name_truncated", "memory_reported"):
                continue
            if getattr(self, item.name) is None:
                setattr(self, item.name, getattr(other, item.name))
        self.memory_reported = self.memory_reported and other.memory_reported

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "name_truncated":
                if value:
                    out[item.name] = True
            elif item.name == "memory_reported":
                if not value:
                    out[item.name] = False
            elif value is not None:
                out[item.name] = value
        return out


@dataclass
class GpuProcess:
    gpu: int | None
    pid: int | None
    name: str | None
    used_mib: int | None = None
    type: str | None = None  # C (compute), G (graphics), C+G, M (MPS)
    gpu_uuid: str | None = None
    # Filled on the live machine from /proc: the whole command line, not nvidia-smi's cut.
    command: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpu": self.gpu,
            "pid": self.pid,
            "name": self.name,
            "used_mib": self.used_mib,
        }
        for extra in ("type", "gpu_uuid", "command"):
            value = getattr(self, extra)
            if value is not None:
                out[extra] = value
        return out


@dataclass
class MigDevice:
    gpu: int
    gi: int | None
    ci: int | None
    mig_dev: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None

    def as_dict(self) -> dict[str, Any]:
        return {k.name: getattr(self, k.name) for k in fields(self)}


@dataclass
class Topology:
    """`nvidia-smi topo -m`: how each pair of devices is connected."""

    devices: list[str] = field(default_factory=list)
    # "GPU0-GPU1" -> "NV18" / "PHB" / ...: GPU pairs, lower index first.
    links: dict[str, str] = field(default_factory=dict)
    # "GPU0-NIC0" -> "PIX": how far each GPU sits from each NIC.
    nic_links: dict[str, str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0
    affinity: dict[str, dict[str, str | None]] = field(default_factory=dict)

    @property
    def nvlink(self) -> bool:
        return any(label.startswith("NV") for label in self.links.values())


@dataclass
class Snapshot:
    source: str  # "nvml", "nvidia-smi", "captured"
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    # False when a table said "No running processes found"; None when no process list was seen.
    processes_listed: bool | None = None
    mig_devices: list[MigDevice] = field(default_factory=list)
    topology: Topology | None = None
    p2p: dict[str, str] | None = None  # `nvidia-smi topo -p2p ...`: "GPU0-GPU1" -> "OK"/"GNS"
    kinds: list[str] = field(default_factory=list)  # which outputs were recognised
    notes: list[str] = field(default_factory=list)  # what was seen but could not be used

    def gpu(self, index: int) -> GpuInfo | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def document(self) -> dict[str, Any]:
        """The stable JSON shape of `sm120 doctor --from PATH --json` (findings added later)."""
        topo = self.topology
        return {
            "source": self.source,
            "kinds": list(self.kinds),
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "gpus": [gpu.as_dict() for gpu in self.gpus],
            "processes": [proc.as_dict() for proc in self.processes],
            "mig_devices": [dev.as_dict() for dev in self.mig_devices],
            "links": dict(topo.links) if topo else {},
            "nvlink": topo.nvlink if topo else None,
            "nic_links": dict(topo.nic_links) if topo else {},
            "nics": dict(topo.nic_names) if topo else {},
            "affinity": dict(topo.affinity) if topo else {},
            "p2p": dict(self.p2p) if self.p2p is not None else None,
            "notes": list(self.notes),
        }
