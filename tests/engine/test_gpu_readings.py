"""GPU activity sources: the nvidia-smi CSV parser (on answers in the format nvidia-smi prints
and a real GB10 capture), NVML, the fallbacks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sm120.engine import gpu_readings
from sm120.engine.gpu_readings import (
    GpuReading,
    NoGpus,
    NvidiaSmiSource,
    NvmlSource,
    ScriptedSource,
    default_source,
    parse_activity_csv,
)
from tests.helpers import DATA_DIR

CAPTURES = DATA_DIR / "nvidia_smi"
CONSTRUCTED = DATA_DIR / "nvidia_smi_constructed"


def test_a_capture_with_units_and_no_index_column() -> None:
    readings = parse_activity_csv((CONSTRUCTED / "activity_one_gpu_units_no_index.txt").read_text())
    assert readings == [
        GpuReading(
            index=0,
            util_pct=0.0,
            power_w=16.89,
            memory_used_mib=3.0,
            memory_total_mib=23034.0,
            temperature_c=31.0,
        )
    ]


def test_a_capture_of_one_idle_and_one_busy_card_among_other_lines() -> None:
    readings = parse_activity_csv((CONSTRUCTED / "activity_idle_and_busy_units.txt").read_text())
    assert [(g.index, g.util_pct, g.power_w, g.memory_used_mib) for g in readings] == [
        (0, 0.0, 30.65, 1.0),
        (1, 100.0, 297.57, 38742.0),
    ]


def test_not_available_fields_read_as_unknown() -> None:
    # GB10 reports its unified memory as [N/A] (gb10_csv_na.txt), power cap too.
    text = "0, 96, 31.20, [N/A], [N/A], [N/A], 58\n"
    assert parse_activity_csv(text) == [
        GpuReading(index=0, util_pct=96.0, power_w=31.2, temperature_c=58.0)
    ]
    header = "memory.used, memory.total, utilization.memory\n"
    gb10 = (CAPTURES / "gb10_csv_na.txt").read_text().split("```text\n")[1].split("\n")[0]
    assert parse_activity_csv(header + gb10) == [GpuReading(index=0)]


def test_the_source_asks_for_the_activity_fields_without_header_or_units() -> None:
    asked: list[Sequence[str]] = []

    def run(argv: Sequence[str]) -> str:
        asked.append(argv)
        return "0, 99, 512.34, 600.00, 90000, 97887, 71\n1, 3, 40.10, 600.00, 90000, 97887, 45\n"

    readings = NvidiaSmiSource(run).read()
    assert asked == [
        [
            "nvidia-smi",
            "--query-gpu=index,utilization.gpu,power.draw,power.limit,memory.used,memory.total,"
            "temperature.gpu",
            "--format=csv,noheader,nounits",
        ]
    ]
    assert readings[0] == GpuReading(0, 99.0, 512.34, 600.0, 90000.0, 97887.0, 71.0)
    assert readings[1].power_w == 40.1 and readings[1].util_pct == 3.0


def test_a_failing_nvidia_smi_gives_no_readings() -> None:
    assert NvidiaSmiSource(lambda argv: "").read() == []
    # A missing binary is the same as no GPUs (the real runner, on a name that is not there).
    assert gpu_readings.run_nvidia_smi(["sm120-no-such-nvidia-smi"]) == ""


class FakeNvml:
    """The few pynvml calls the source makes; card 1 answers nothing but utilisation."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.initialised = False

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=97 if handle == 0 else 2)

    def _only_card_0(self, handle: int, value: Any) -> Any:
        if handle:
            raise RuntimeError("Not Supported")
        return value

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return int(self._only_card_0(handle, 512_340))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return int(self._only_card_0(handle, 600_000))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return self._only_card_0(handle, SimpleNamespace(used=1024 * 1024**2, total=2048 * 1024**2))

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return int(self._only_card_0(handle, 70))


def test_nvml_readings_in_watts_and_mib_and_unsupported_values_unknown() -> None:
    nvml = FakeNvml()
    source = NvmlSource(nvml)  # type: ignore[arg-type]
    assert nvml.initialised
    assert source.read() == [
        GpuReading(0, 97.0, 512.34, 600.0, 1024.0, 2048.0, 70.0),
        GpuReading(1, util_pct=2.0),
    ]
    source.close()
    assert not nvml.initialised


def test_without_nvml_or_nvidia_smi_there_are_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_readings, "load_nvml", lambda: None)
    monkeypatch.setenv("PATH", "/nonexistent")
    source = default_source()
    assert isinstance(source, NoGpus) and source.read() == []


def test_nvml_that_does_not_load_falls_back_to_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("no driver")))
    monkeypatch.setattr(gpu_readings, "load_nvml", lambda: broken)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 50, 100, 400, 1, 2, 40'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    source = default_source()
    assert isinstance(source, NvidiaSmiSource)
    assert source.read() == [GpuReading(0, 50.0, 100.0, 400.0, 1.0, 2.0, 40.0)]


def test_scripted_frames_repeat_the_last() -> None:
    source = ScriptedSource([[GpuReading(0, 1.0)], [GpuReading(0, 2.0)]])
    assert [source.read()[0].util_pct for _ in range(3)] == [1.0, 2.0, 2.0]
    assert ScriptedSource([]).read() == []


def test_a_reading_round_trips_through_live_json() -> None:
    reading = GpuReading(1, 97.0, 512.34, 600.0, 1024.0, 2048.0, 70.0)
    assert GpuReading.from_dict(reading.as_dict()) == reading
    assert reading.as_dict() == {
        "index": 1,
        "util_pct": 97.0,
        "power_w": 512.34,
        "power_limit_w": 600.0,
        "memory_used_mib": 1024.0,
        "memory_total_mib": 2048.0,
        "temperature_c": 70.0,
    }
