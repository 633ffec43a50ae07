"""A SIGTERM or Ctrl-C that lands after a healthy start but before the launcher has handed
the engine over (the gate, the banner, the READY notification of --foreground) stops the
deployment like one during the start does. CI once caught the READY=1 window for real
(tests/integration/test_service_foreground.py: exit 130, the engine left running); these
make each window happen on purpose. The launcher's SIGTERM handler turns the signal into
KeyboardInterrupt, so raising that is what the signal does."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from sm120.deploy import serving


class View:
    def __init__(self, interrupt_banner: bool = False) -> None:
        self.lines: list[str] = []
        self.interrupt_banner = interrupt_banner

    def line(self, text: str) -> None:
        self.lines.append(text)

    @contextmanager
    def starting(self, what: str, timeout_s: float) -> Iterator[Any]:
        yield SimpleNamespace(
            message=self.line,
            update=lambda *_: None,
            provisioning=lambda _what: None,
            asking=lambda confirm: confirm,
        )

    def error(self, exc: Exception) -> None:
        self.lines.append(f"error: {exc}")

    def ready(self, ready: Any) -> None:
        if self.interrupt_banner:
            raise KeyboardInterrupt


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    stopped: list[str] = []

    def stop(name: str) -> Any:
        stopped.append(name)
        return SimpleNamespace(describe=lambda: f"stopped {name}")

    monkeypatch.setattr(serving, "stop_deployment", stop)
    previous = signal.getsignal(signal.SIGTERM)
    yield stopped
    signal.signal(signal.SIGTERM, previous)  # serve() installs its own


READY = SimpleNamespace(state=SimpleNamespace(name="tiny"), monitor_pid=None)


def test_sigterm_during_the_ready_notification_stops_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, stops: list[str]
) -> None:
    sent: list[str] = []

    def notify(message: str) -> bool:
        sent.append(message)
        if message.startswith("READY=1"):
            raise KeyboardInterrupt
        return True

    monkeypatch.setattr(serving, "notify", notify)
    view = View()
    code = serving.follow_until_interrupted(READY, runtime=None, view=view)  # type: ignore[arg-type]
    assert code == 0
    assert stops == ["tiny"]
    assert view.lines == ["stopping...", "stopped tiny"]
    assert sent[-1] == "STOPPING=1"


def serve(monkeypatch: pytest.MonkeyPatch, view: View, foreground: bool) -> int:
    monkeypatch.setattr(serving, "launch", lambda *_args, **_kwargs: READY)
    monkeypatch.setattr(serving, "notify", lambda _message: False)
    checked = SimpleNamespace(
        plan=SimpleNamespace(recipe="tiny", timeouts=SimpleNamespace(ready_s=60))
    )
    options = SimpleNamespace(timeout_s=None, confirm=None)
    return serving.serve(checked, options, view=view, foreground=foreground)  # type: ignore[arg-type]


def test_an_interrupt_during_the_banner_stops_what_started(
    monkeypatch: pytest.MonkeyPatch, stops: list[str]
) -> None:
    view = View(interrupt_banner=True)
    assert serve(monkeypatch, view, foreground=False) == serving.EXIT_INTERRUPTED
    assert stops == ["tiny"]
    assert view.lines[-2:] == ["stopping...", "stopped tiny"]


def test_under_foreground_the_same_interrupt_is_the_service_stop_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, stops: list[str]
) -> None:
    view = View(interrupt_banner=True)
    assert serve(monkeypatch, view, foreground=True) == 0
    assert stops == ["tiny"]


def test_a_clean_launch_is_left_running(monkeypatch: pytest.MonkeyPatch, stops: list[str]) -> None:
    assert serve(monkeypatch, View(), foreground=False) == 0
    assert stops == []
