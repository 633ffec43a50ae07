"""What GPUs this machine has, as nvidia-smi reports them: the `detected` Hardware that
launch, the container entrypoint and the placement check hand to the plan."""

from __future__ import annotations

import shutil
import subprocess

from sm120.doctor.nvsmi_parse import parse_query_csv
from sm120.plan.hardware import Hardware, arch_from_compute_cap

DETECT_FIELDS = ["name", "compute_cap"]


def detect(timeout: float = 10.0) -> Hardware | None:
    """GPUs as nvidia-smi reports them; None when there is no driver (the CPU case)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        result = subprocess.run(
            [binary, f"--query-gpu={','.join(DETECT_FIELDS)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return hardware_from_csv(result.stdout)


def hardware_from_csv(text: str) -> Hardware | None:
    """The `--query-gpu=name,compute_cap --format=csv,noheader` answer, read by the one CSV
    parser doctor also uses for captured outputs."""
    gpus = [g for g in parse_query_csv(text, DETECT_FIELDS).gpus if g.compute_cap]
    if not gpus:
        return None
    archs = {arch_from_compute_cap(g.compute_cap or "") for g in gpus}
    arch = archs.pop() if len(archs) == 1 else "mixed"
    return Hardware(len(gpus), arch, "detected", tuple(g.name or "" for g in gpus))
