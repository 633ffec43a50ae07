"""Starting, watching and stopping engines. Kept light: the supervisor imports this package."""

from sm120.engine.runtime.base import ExitInfo, LaunchSpec, Runtime, RuntimeStatus

__all__ = ["ExitInfo", "LaunchSpec", "Runtime", "RuntimeStatus"]
