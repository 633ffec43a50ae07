"""How busy each GPU is right now: utilisation, power, memory and temperature, read through
NVML (nvidia-ml-py) when it loads, else `nvidia-smi`'s CSV query, else nothing.

Neutral ground: the doctor's GPU probe and the monitor's watchdog both read GPUs, and
features do not import each other, so the NVML loader lives here and both use it.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, Protocol

# The fields the nvidia-smi source asks for, in this order.
ACTIVITY_FIELDS = (
    "index",
    "utilization.gpu",
    "power.draw",
    "power.limit",
    "memory.used",
    "memory.total",
    "temperature.gpu",
)
NVIDIA_SMI_TIMEOUT_S = 10.0
MIB = 1024 * 1024
# What nvidia-smi prints for a value the card cannot report (GB10 memory, MIG util, ...).
# A header cell: a field name, with its unit in brackets when nounits was not given.
_HEADER_CELL = re.compile(r"[a-z_.]+(?: \[[^\]]*\])?")
_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}


@dataclass(frozen=True)
class GpuReading:
    index: int
    util_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuReading:
        def number(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, (int, float)) else None

        return cls(
            index=int(data.get("index") or 0),
            util_pct=number("util_pct"),
            power_w=number("power_w"),
            power_limit_w=number("power_limit_w"),
            memory_used_mib=number("memory_used_mib"),
            memory_total_mib=number("memory_total_mib"),
            temperature_c=number("temperature_c"),
        )


class GpuSource(Protocol):
    """One reading per visible GPU; an empty list when there are no GPUs to read."""

    def read(self) -> list[GpuReading]: ...


def load_nvml() -> ModuleType | None:
    """pynvml from nvidia-ml-py, if installed (it is optional)."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class NoGpus:
    """A machine without NVIDIA GPUs (or drivers): every verdict works as without readings."""

    def read(self) -> list[GpuReading]:
        return []


class ScriptedSource:
    """Readings from a script, one frame per read; the last frame repeats (tests)."""

    def __init__(self, frames: Sequence[Sequence[GpuReading]]) -> None:
        self.frames = [list(frame) for frame in frames]
        self.reads = 0

    def read(self) -> list[GpuReading]:
        if not self.frames:
            return []
        frame = self.frames[min(self.reads, len(self.frames) - 1)]
        self.reads += 1
        return frame


class NvmlSource:
    """NVML, initialised once; a GPU that stops answering gives no reading that poll."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        nvml.nvmlInit()  # raises when the driver library does not load: caller falls back

    def read(self) -> list[GpuReading]:
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception:  # the driver went away: no readings rather than a failed poll
            return []
        readings: list[GpuReading] = []
        for index in range(count):
            with contextlib.suppress(Exception):
                readings.append(_nvml_reading(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index)))
        return readings

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def _nvml_value(read: Callable[[], Any], scale: float = 1.0) -> float | None:
    try:
        return float(read()) / scale
    except Exception:  # "Not Supported" on this card (GB10 memory, some power sensors)
        return None


def _nvml_reading(nvml: ModuleType, index: int, handle: Any) -> GpuReading:
    used = total = None
    with contextlib.suppress(Exception):
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        used, total = int(memory.used) / MIB, int(memory.total) / MIB
    return GpuReading(
        index=index,
        util_pct=_nvml_value(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        # NVML reports milliwatts.
        power_w=_nvml_value(lambda: nvml.nvmlDeviceGetPowerUsage(handle), 1000.0),
        power_limit_w=_nvml_value(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle), 1000.0),
        memory_used_mib=used,
        memory_total_mib=total,
        temperature_c=_nvml_value(
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        ),
    )


Run = Callable[[Sequence[str]], str]


def run_nvidia_smi(argv: Sequence[str]) -> str:
    """stdout of nvidia-smi, or "" when it fails or hangs (a wedged driver can hang it)."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


class NvidiaSmiSource:
    def __init__(self, run: Run = run_nvidia_smi) -> None:
        self.run = run

    def read(self) -> list[GpuReading]:
        text = self.run(
            [
                "nvidia-smi",
                f"--query-gpu={','.join(ACTIVITY_FIELDS)}",
                "--format=csv,noheader,nounits",
            ]
        )
        return parse_activity_csv(text)


def _number(cell: str) -> float | None:
    text = cell.strip()
    if text.lower() in _MISSING:
        return None
    # With units (`--format=csv` without nounits) a value reads "512.34 W", "98 %", "3 MiB".
    text = text.split()[0] if text else text
    try:
        return float(text)
    except ValueError:
        return None


def _field_name(header_cell: str) -> str:
    return header_cell.split("[")[0].strip().lower()


def parse_activity_csv(text: str, fields: Sequence[str] = ACTIVITY_FIELDS) -> list[GpuReading]:
    """Rows of an nvidia-smi `--query-gpu` CSV. A header line, when present, names the
    columns (any order, any subset, units or not); without one the columns are `fields`.
    Lines that are not rows (prose, a shell prompt, a fence) are skipped."""
    columns = list(fields)
    readings: list[GpuReading] = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) < 2:
            continue
        if all(_HEADER_CELL.fullmatch(cell.lower()) for cell in cells):
            columns = [_field_name(cell) for cell in cells]
            continue
        if len(cells) != len(columns):
            continue
        row = dict(zip(columns, cells, strict=True))
        # Without an index column the rows come in GPU order.
        index = _number(row["index"]) if "index" in row else float(len(readings))
        if index is None:
            continue
        readings.append(
            GpuReading(
                index=int(index),
                util_pct=_number(row.get("utilization.gpu", "")),
                power_w=_number(row.get("power.draw", "")),
                power_limit_w=_number(row.get("power.limit", "")),
                memory_used_mib=_number(row.get("memory.used", "")),
                memory_total_mib=_number(row.get("memory.total", "")),
                temperature_c=_number(row.get("temperature.gpu", "")),
            )
        )
    return readings


def default_source() -> GpuSource:
    """NVML when it loads, else nvidia-smi when it is on PATH, else no GPUs."""
    nvml = load_nvml()
    if nvml is not None:
        with contextlib.suppress(Exception):
            return NvmlSource(nvml)
    if shutil.which("nvidia-smi"):
        return NvidiaSmiSource()
    return NoGpus()
