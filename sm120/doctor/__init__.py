"""`sm120 doctor`: will it run here, and if not, why. Read-only checks of the driver, GPUs,
memory holders, interconnect, engine, containers, disk, shared memory, port and RAM; the
same parsers read `nvidia-smi` outputs pasted into bug reports (`--from`).

The public entry points live in sm120.doctor.run and load on first use, so importing the
parsers (sm120.doctor.detect does) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sm120.doctor.run import diagnose_captured, preflight, run_doctor

__all__ = ["diagnose_captured", "preflight", "run_doctor"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sm120.doctor import run

        return getattr(run, name)
    raise AttributeError(name)
