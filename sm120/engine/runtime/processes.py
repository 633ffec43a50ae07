"""Processes as /proc sees them, and whether a recorded one is still the one we started.

A pid in a state file is only a number: once its process ends the system hands the number
to the next process that asks. So a deployment records each process's start time as well
(/proc/PID/stat field 22, clock ticks since boot), and nothing is signalled unless a live
process still has both. A process group is ours while one of its members is provably ours:
a live member keeps the group's number from being given out again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

PROC = Path("/proc")
# Wall-clock start times from /proc are good to a clock tick plus btime's whole second.
START_TIME_SLACK_S = 1.0


class StatFields(NamedTuple):
    state: str
    ppid: int
    pgrp: int
    session: int
    start_ticks: int


def stat_fields(pid: int) -> StatFields | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    after_name = text[text.rfind(")") + 2 :].split()
    return StatFields(
        state=after_name[0],
        ppid=int(after_name[1]),
        pgrp=int(after_name[2]),
        session=int(after_name[3]),
        # Field 22 overall; the state is field 3.
        start_ticks=int(after_name[19]),
    )


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot; None if it does not exist."""
    fields = stat_fields(pid)
    return fields.start_ticks if fields is not None else None


def command_line(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


@dataclass(frozen=True)
class RecordedProcess:
    """A process a deployment started: its pid and start time or, for state files written
    before start times were recorded, the command-line words that must name it instead."""

    pid: int
    start_ticks: int | None
    marker: tuple[str, ...] = ()

    def is_running(self) -> bool:
        fields = self._fields()
        return fields is not None and fields.state != "Z"

    def exists(self) -> bool:
        """Running, or a zombie not yet reaped: either way its number is still its own."""
        return self._fields() is not None

    def _fields(self) -> StatFields | None:
        """The /proc view of this very process, or None if the pid now names another."""
        if self.pid <= 1:
            return None  # the scheduler and init are never a deployment's
        fields = stat_fields(self.pid)
        if fields is None:
            return None
        if self.start_ticks is not None:
            return fields if fields.start_ticks == self.start_ticks else None
        words = command_line(self.pid)
        return fields if self.marker and all(word in words for word in self.marker) else None


@dataclass(frozen=True)
class OwnedGroup:
    """The process group a supervisor created by starting a new session (pgid == its pid)."""

    leader: RecordedProcess
    # The engine, the supervisor's child: it keeps the group ours if the supervisor died.
    engine: RecordedProcess | None = None
    # When the supervisor recorded the engine's end (read afresh each time, as it may come
    # while we wait): members started before it were in the group while it was ours, so
    # its number was never free to be given out again.
    ended_at: Callable[[], float | None] = field(default=lambda: None)

    @property
    def pgid(self) -> int:
        return self.leader.pid

    def is_ours(self) -> bool:
        if self.leader.exists():
            return True
        if stat_fields(self.pgid) is not None:
            # The kernel never gives out a number a live group or session still uses: a
            # process under the leader's number now proves our group is gone, whatever an
            # exit file says (anyone can write one).
            return False
        if self.engine is not None and self.engine.is_running():
            engine = stat_fields(self.engine.pid)
            return engine is not None and engine.pgrp == self.pgid
        ended = self.ended_at()
        return ended is not None and any(
            self._started_before(pid, ended) for pid in group_members(self.pgid)
        )

    def _started_before(self, pid: int, ended: float) -> bool:
        fields = stat_fields(pid)
        # The supervisor's session holds everything it started; a stranger that was given
        # the number later would lead a session of its own number only after `ended`.
        if fields is None or fields.session != self.pgid:
            return False
        floor = self.leader.start_ticks
        if floor is not None and fields.start_ticks < floor:
            return False  # older than the supervisor that made the session: not its child
        started = started_at(fields.start_ticks)
        return started is not None and started <= ended + START_TIME_SLACK_S

    def members(self) -> list[int]:
        """Live members, or none at all when the group is not provably ours."""
        return group_members(self.pgid) if self.is_ours() else []

    def has_live_member(self) -> bool:
        """Whether anything of the group still runs. The leader or the engine answers it with
        one /proc read; only when both are gone does it take the scan of every process that
        `members` does (a launch's wait and the monitor ask many times a second)."""
        if self.leader.is_running():
            return True  # a session leader stays in its own group: a member, provably ours
        if self.engine is not None and self.engine.is_running():
            engine = stat_fields(self.engine.pid)
            if engine is not None and engine.pgrp == self.pgid:
                return True
        return bool(self.members())


def started_at(ticks: int) -> float | None:
    """A start time in clock ticks since boot, as seconds since the epoch."""
    boot = boot_time()
    return None if boot is None else boot + ticks / os.sysconf("SC_CLK_TCK")


def boot_time() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in (PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    return None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group."""
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is not None and fields.state != "Z" and fields.pgrp == pgid:
            members.append(int(entry.name))
    return members


def find_child_pid(parent: int, skip: str | None = None) -> int | None:
    """The parent's first child; with `skip`, the first whose command line does not name it
    (the supervisor of a warded engine starts the ward first)."""
    children = _children_from_task_files(parent)
    if not children:
        children = _children_from_stat_scan(parent)
    if skip is not None:
        children = [pid for pid in children if skip not in _command_line(pid)]
    return min(children) if children else None


def _command_line(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _children_from_task_files(parent: int) -> list[int]:
    children: list[int] = []
    for task_children in PROC.glob(f"{parent}/task/*/children"):
        with contextlib.suppress(OSError):
            children += [int(pid) for pid in task_children.read_text().split()]
    return children


def _children_from_stat_scan(parent: int) -> list[int]:
    children = []
    for entry in PROC.glob("[0-9]*"):
        fields = stat_fields(int(entry.name))
        if fields is not None and fields.ppid == parent:
            children.append(int(entry.name))
    return children
