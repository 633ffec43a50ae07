"""`sm120 tune NAME`, whole: the space checked, every candidate planned and checked by the
rules (free), the rest launched, warmed and measured one by one within the budget, then the
leader and the default measured alternately, and the result kept for this host.

What was measured is written after every candidate and every pair (tuned/runs/), so a run
stopped by Ctrl-C or a crash goes on from there when the same command runs again, and a run
that finds engines a crashed one left behind stops them first. Engines start and stop
through the launch's own sequence (deploy.session.prepare, deploy.launcher.launch,
deploy.stop.stop_sequence); whatever happens, none is left running.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from sm120.core.defaults import TUNE_ROUNDS
from sm120.core.errors import PlanError, SM120Error
from sm120.core.net import client_url
from sm120.deploy.checked import checked_plan
from sm120.deploy.launcher import LaunchOptions, launch
from sm120.deploy.session import LaunchRequest, prepare
from sm120.deploy.stop import stop_sequence
from sm120.deploy.tuned import (
    host_fingerprint,
    load_result,
    result_key,
    save_result,
    tuned_dir,
)
from sm120.doctor.detect import detect
from sm120.engine.runtime.native import NativeRuntime
from sm120.engine.secrets import read_api_key
from sm120.engine.state import list_states
from sm120.plan.hardware import Hardware
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve
from sm120.recipe.loader import load_recipe
from sm120.server.wire import Wire
from sm120.tune.chart import write_svg
from sm120.tune.objective import Objective, PromptMaker, check_objective, measure
from sm120.tune.pairs import Pair, verdict
from sm120.tune.search import Outcome, leader, next_batch
from sm120.tune.space import Candidate, Space, TuneError, build_space, candidate_request
from sm120.tune.workload import Workload, build_workload

DEFAULT_ROUNDS = TUNE_ROUNDS


class TuneInterrupted(SM120Error):
    """Ctrl-C or SIGTERM: what was measured is kept, nothing is left running."""


class TuneView(Protocol):
    def line(self, text: str) -> None:
        """A line of progress, on stderr."""

    def step(self, done: int, total: int, eta_s: float | None, text: str) -> None:
        """Where the search is: `done` of about `total` steps, and the time left."""


@dataclass(frozen=True)
class TuneRequest:
    plan: PlanRequest  # the recipe, variants, model dir and --set that every candidate shares
    objective: str | None = None  # None: the tune: block's
    workload: str | None = None
    budget_s: float = 3600.0
    concurrency: int | None = None
    rounds: int = DEFAULT_ROUNDS
    pairs: int | None = None
    vllm_python: str | None = None
    timeout_s: float | None = None
    fresh: bool = False
    command: str = ""  # as typed, for the result's provenance


@dataclass
class Progress:
    """What a run has measured, as kept on disk between runs."""

    identity: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    pairs: list[Pair] = field(default_factory=list)
    spent_s: float = 0.0
    started_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "outcomes": [o.as_dict() for o in self.outcomes.values()],
            "pairs": [p.as_dict() for p in self.pairs],
            "spent_s": round(self.spent_s, 2),
            "started_at": self.started_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress:
        outcomes = [Outcome.from_dict(o) for o in data.get("outcomes", [])]
        return cls(
            str(data["identity"]),
            {o.candidate.key: o for o in outcomes},
            [
                Pair(float(p["default"]), float(p["leader"]), bool(p["leader_first"]))
                for p in data.get("pairs", [])
            ],
            float(data.get("spent_s", 0.0)),
            float(data.get("started_at", time.time())),
        )


def _pair(data: dict[str, Any]) -> Pair:
    return Pair(
        float(data["default"]),
        float(data["leader"]),
        bool(data["leader_first"]),
        str(data.get("leader_key", "")),
    )


def progress_path(key: str) -> Path:
    return tuned_dir() / "runs" / f"{key}.json"


def _load_progress(path: Path, identity: str, fresh: bool) -> tuple[Progress, str | None]:
    if fresh or not path.is_file():
        return Progress(identity), None
    try:
        progress = Progress.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return Progress(identity), f"the progress in {path} could not be read; starting over"
    if progress.identity != identity:
        return Progress(identity), (
            "the space, objective, workload or host changed since the last run; starting over"
        )
    measured = len(progress.outcomes)
    return progress, f"resuming: {measured} candidates and {len(progress.pairs)} pairs kept"


def save_progress(path: Path, progress: Progress) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".part")
    temporary.write_text(json.dumps(progress.as_dict(), indent=1))
    temporary.replace(path)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Running:
    name: str
    base_url: str
    api_key: str | None
    model: str


class Engines:
    """The candidates' deployments, started and stopped through the launch's own sequence."""

    def __init__(self, request: TuneRequest, prefix: str, view: TuneView) -> None:
        self.request = request
        self.prefix = prefix
        self.view = view
        self.running: dict[str, Running] = {}

    def start(self, candidate: Candidate) -> Running:
        name = f"{self.prefix}-{candidate.key[:8]}"
        plan = replace(candidate_request(self.request.plan, candidate), port=free_port())
        launch_request = LaunchRequest(
            plan=plan,
            name=name,
            vllm_python=self.request.vllm_python,
            replace=True,
            yes=True,
            monitor=False,
            use_tuned=False,
            timeout_s=self.request.timeout_s,
        )
        prepared = prepare(launch_request)
        options = LaunchOptions(
            name=name,
            vllm_python=self.request.vllm_python,
            replace=True,
            monitor=False,
            timeout_s=self.request.timeout_s,
        )
        ready = launch(prepared.checked, NativeRuntime(), options, self._quiet, _no_phases)
        state = ready.state
        running = Running(
            name,
            client_url(state.host, state.port),
            read_api_key(state.api_key_file),
            ready.plan.model.served_name,
        )
        self.running[candidate.key] = running
        return running

    def stop(self, candidate: Candidate) -> None:
        running = self.running.pop(candidate.key, None)
        if running is not None:
            _stop_named(running.name)

    def stop_all(self) -> None:
        for key in list(self.running):
            running = self.running.pop(key)
            _stop_named(running.name)

    def _quiet(self, text: str) -> None:
        if text.startswith("warning"):
            self.view.line(f"  {text}")


def _no_phases(update: object, elapsed: float) -> None:
    return None


def _stop_named(name: str) -> None:
    for state in list_states():
        if state.name == name:
            with contextlib.suppress(SM120Error, OSError):
                stop_sequence(state)


def stop_leftovers(prefix: str) -> list[str]:
    """Engines a crashed run of the same search left behind: stopped before anything starts."""
    stopped = []
    for state in list_states():
        if state.name.startswith(f"{prefix}-"):
            with contextlib.suppress(SM120Error, OSError):
                stop_sequence(state)
                stopped.append(state.name)
    return stopped


@dataclass
class Search:
    request: TuneRequest
    view: TuneView
    plan: LaunchPlan
    hardware: Hardware
    space: Space
    objective: Objective
    workload: Workload
    fingerprint: dict[str, Any]
    progress: Progress
    path: Path
    engines: Engines
    pairs_wanted: int
    clock_start: float = field(default_factory=lambda: time.monotonic())
    makers: dict[str, PromptMaker] = field(default_factory=dict)

    # -- time ------------------------------------------------------------------------

    def spent(self) -> float:
        return self.progress.spent_s + (time.monotonic() - self.clock_start)

    def _launched(self) -> list[Outcome]:
        return [o for o in self.progress.outcomes.values() if o.status != "skipped"]

    def candidate_estimate(self) -> float | None:
        launched = self._launched()
        return sum(o.seconds for o in launched) / len(launched) if launched else None

    def pairs_estimate(self) -> float:
        per = self.candidate_estimate() or 0.0
        left = self.pairs_wanted - len(self.progress.pairs)
        if self.space.block.side_by_side:
            # No launch: a pair is two measurements, and a candidate's time is its launch
            # plus rounds + 1 of them; half of that share is a generous bound on one.
            return left * 2 * per / (self.request.rounds + 1) * 0.5
        return left * 2 * per  # each pair launches, warms and measures both

    def eta(self, left_candidates: int) -> float | None:
        per = self.candidate_estimate()
        return None if per is None else left_candidates * per + self.pairs_estimate()

    # -- the search --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        higher = self.objective.higher_is_better
        untried = 0
        while True:
            batch = next_batch(self.space, self.progress.outcomes, higher)
            if not batch:
                break
            runnable = []
            for candidate in batch:
                reason = self.precheck(candidate)
                if reason is None:
                    runnable.append(candidate)
                    continue
                self.record(Outcome(candidate, "skipped", reason=reason))
                self.view.line(f"skipped {candidate.label}: {reason}")
            if not runnable:
                continue
            if not self.space.block.side_by_side:
                runnable = runnable[:1]  # one engine at a time
            # Side by side, a batch's engines start at once: about one launch for all.
            estimate = self.candidate_estimate() or 0.0
            over = self.spent() + estimate + self.pairs_estimate() > self.request.budget_s
            if over and self.progress.outcomes:
                untried = self.space.size - len(self.progress.outcomes)
                self.view.line(
                    f"budget: {self.request.budget_s / 60:g} min would be exceeded; "
                    f"about {untried} candidates left untried"
                )
                break
            self.measure_batch(runnable)
        self.measure_pairs()
        self.engines.stop_all()
        return self.result(untried)

    def precheck(self, candidate: Candidate) -> str | None:
        """The planner and the rules, free: why it cannot run here, or None."""
        try:
            checked = checked_plan(candidate_request(self.request.plan, candidate), self.hardware)
        except PlanError as exc:
            return exc.message
        failed = checked.failed
        if failed:
            return f"[{failed[0].id}] {failed[0].messages[0]}"
        return None

    def measure_batch(self, batch: list[Candidate]) -> None:
        done = len(self.progress.outcomes)
        total = max(self.space.size, done + len(batch))
        eta = self.eta(total - done)
        names = ", ".join(candidate.label for candidate in batch)
        self.view.step(done, total, eta, f"{names}: launching")
        started = time.monotonic()
        launched = self.start_all(batch + self.pair_engines_missing())
        launch_s = time.monotonic() - started
        for candidate in batch:
            measuring = time.monotonic()
            got = launched[candidate.key]
            try:
                if isinstance(got, SM120Error):
                    raise got
                self.view.step(done, total, eta, f"{candidate.label}: warming up, measuring")
                self.sample(got, f"warm-{candidate.key}")
                samples = [self.sample(got, f"round-{i}") for i in range(self.request.rounds)]
                outcome = Outcome(
                    candidate, "measured", samples, seconds=launch_s + time.monotonic() - measuring
                )
            except SM120Error as exc:
                self.engines.stop(candidate)
                seconds = launch_s + time.monotonic() - measuring
                outcome = Outcome(candidate, "failed", reason=exc.message, seconds=seconds)
                self.view.line(f"failed {candidate.label}: {exc.message}")
            self.record(outcome)
            self.keep_or_stop(candidate)
            if outcome.value is not None:
                self.view.line(
                    f"measured {candidate.label}: {outcome.value:,.2f} {self.objective.unit} "
                    f"({', '.join(f'{s:,.2f}' for s in outcome.samples)})"
                )

    def pair_engines_missing(self) -> list[Candidate]:
        """Side by side, the default and the leader stay up for the pairs; a resumed search
        starts them again with its next batch, at once, rather than one by one at the end."""
        if not self.space.block.side_by_side:
            return []
        best = leader(self.progress.outcomes, self.objective.higher_is_better)
        wanted = [Candidate()] + ([best.candidate] if best is not None else [])
        missing = [c for c in wanted if c.key in self.progress.outcomes]
        return [c for c in dict.fromkeys(missing) if c.key not in self.engines.running]

    def start_all(self, batch: list[Candidate]) -> dict[str, Running | SM120Error]:
        """Each candidate's engine, or why it did not start; a batch starts side by side."""

        def start(candidate: Candidate) -> Running | SM120Error:
            try:
                return self.engines.start(candidate)
            except SM120Error as exc:
                return exc

        if len(batch) == 1:
            return {batch[0].key: start(batch[0])}
        pool = ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="tune-launch")
        futures = {candidate.key: pool.submit(start, candidate) for candidate in batch}
        try:
            return {key: future.result() for key, future in futures.items()}
        finally:
            # Ctrl-C here: the launches under way finish (each stops itself if it fails),
            # so the caller's stop_all finds every engine that came up.
            pool.shutdown(wait=True)

    def keep_or_stop(self, candidate: Candidate) -> None:
        """Side by side, the default and the leader stay up for the pairs; else nothing."""
        if not self.space.block.side_by_side:
            self.engines.stop(candidate)
            return
        best = leader(self.progress.outcomes, self.objective.higher_is_better)
        keep = {Candidate().key, best.candidate.key if best else ""}
        for key in list(self.engines.running):
            measured = self.progress.outcomes.get(key)  # the batch's others still wait
            if measured is not None and key not in keep:
                self.engines.stop(measured.candidate)

    def sample(self, running: Running, salt: str) -> float:
        maker = self.makers.get(running.name)
        if maker is None:
            wire = Wire(running.base_url, running.api_key, timeout=600.0)
            maker = self.makers[running.name] = PromptMaker(wire, running.model)
        return measure(
            self.objective,
            self.workload,
            maker,
            running.base_url,
            running.api_key,
            running.model,
            salt,
        )

    def measure_pairs(self) -> None:
        best = leader(self.progress.outcomes, self.objective.higher_is_better)
        if best is None or best.candidate.is_default:
            return
        default = Candidate()
        # Pairs kept from before a search went on belong to the leader they measured.
        self.progress.pairs = [
            pair for pair in self.progress.pairs if pair.leader_key == best.candidate.key
        ]
        while len(self.progress.pairs) < self.pairs_wanted:
            index = len(self.progress.pairs)
            leader_first = index % 2 == 0
            order = [best.candidate, default] if leader_first else [default, best.candidate]
            self.view.step(
                index,
                self.pairs_wanted,
                self.pairs_estimate(),
                f"pair {index + 1} of {self.pairs_wanted}: leader and default, alternately",
            )
            figures: dict[str, float] = {}
            for candidate in order:
                figures[candidate.key] = self.pair_figure(candidate, f"pair-{index}")
            self.progress.pairs.append(
                Pair(
                    figures[default.key],
                    figures[best.candidate.key],
                    leader_first,
                    best.candidate.key,
                )
            )
            self.save()

    def pair_figure(self, candidate: Candidate, salt: str) -> float:
        running = self.engines.running.get(candidate.key)
        fresh = running is None
        if running is None:
            running = self.engines.start(candidate)
            self.sample(running, f"warm-{salt}-{candidate.key}")
        value = self.sample(running, salt)
        if fresh and not self.space.block.side_by_side:
            self.engines.stop(candidate)
        return value

    def record(self, outcome: Outcome) -> None:
        self.progress.outcomes[outcome.candidate.key] = outcome
        self.save()

    def save(self) -> None:
        self.progress.spent_s, self.clock_start = self.spent(), time.monotonic()
        save_progress(self.path, self.progress)

    # -- the result --------------------------------------------------------------------

    def result(self, untried: int) -> dict[str, Any]:
        higher = self.objective.higher_is_better
        best = leader(self.progress.outcomes, higher)
        default = self.progress.outcomes.get(Candidate().key)
        found = verdict(self.progress.pairs, higher)
        if best is not None and best.candidate.is_default:
            found = {"gain": False, "pairs": 0, "why": "the default measured best"}
        winner = best if found["gain"] and best is not None else default
        key = result_key(self.plan.recipe, self.plan.variants)
        document = {
            "version": 1,
            "key": key,
            "recipe": self.plan.recipe,
            "variants": list(self.plan.variants),
            "base_sets": list(self.request.plan.sets),
            "command": self.request.command,
            "objective": self.objective.name,
            "objective_label": self.objective.label,
            "unit": self.objective.unit,
            "higher_is_better": higher,
            "concurrency": self.objective.concurrency,
            "workload": self.workload.name,
            "workload_description": self.workload.describe(),
            "workload_notes": list(self.workload.notes),
            "rounds": self.request.rounds,
            "budget_s": self.request.budget_s,
            "spent_s": round(self.spent(), 1),
            "untried": untried,
            "fingerprint": self.fingerprint,
            "started_at": self.progress.started_at,
            "finished_at": time.time(),
            "candidates": [o.as_dict() for o in self.progress.outcomes.values()],
            "default": default.as_dict() if default else None,
            "leader": best.as_dict() if best else None,
            "pairs": [p.as_dict() for p in self.progress.pairs],
            "verdict": found,
            "winner": winner.candidate.as_dict() if winner else Candidate().as_dict(),
        }
        document["saved"] = str(save_result(document))
        document["chart"] = str(write_svg(document, tuned_dir() / f"{key}.svg"))
        return document


def start_search(request: TuneRequest, view: TuneView) -> Search:
    """Everything checked before an engine starts: objective, workload, space, fingerprint."""
    recipe = load_recipe(request.plan.recipe)
    hardware = detect() or Hardware(gpus=0, arch="cpu", source="detected")
    default = checked_plan(request.plan, hardware)
    default.raise_on_failure()
    plan = default.plan
    space = build_space(recipe, request.plan, plan)
    block = space.block
    objective = Objective(
        check_objective(request.objective or block.objective),
        request.concurrency or block.concurrency,
    )
    limit = plan.arg("max-model-len")
    workload = build_workload(
        request.workload or block.workload,
        objective.sessions_wanted(),
        limit if isinstance(limit, int) and limit > 0 else None,
    )
    fingerprint = host_fingerprint(plan)
    key = result_key(plan.recipe, plan.variants)
    identity = _identity(request, space, objective, workload, fingerprint)
    path = progress_path(key)
    progress, said = _load_progress(path, identity, request.fresh)
    if said:
        view.line(said)
    prefix = f"tune-{key.replace('+', '-')}"
    for name in stop_leftovers(prefix):
        view.line(f"stopped {name}, left running by an earlier run")
    return Search(
        request=request,
        view=view,
        plan=plan,
        hardware=hardware,
        space=space,
        objective=objective,
        workload=workload,
        fingerprint=fingerprint,
        progress=progress,
        path=path,
        engines=Engines(request, prefix, view),
        pairs_wanted=request.pairs or block.pairs,
    )


def _identity(
    request: TuneRequest,
    space: Space,
    objective: Objective,
    workload: Workload,
    fingerprint: dict[str, Any],
) -> str:
    payload = {
        "space": space.block.model_dump(mode="json"),
        "sets": list(request.plan.sets),
        "objective": [objective.name, objective.concurrency],
        "workload": workload.describe(),
        "rounds": request.rounds,
        "fingerprint": fingerprint,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def kept_result(plan_request: PlanRequest) -> dict[str, Any]:
    """`sm120 tune NAME --show`: the result kept for this recipe and variants."""
    plan = resolve(plan_request)
    document = load_result(plan.recipe, plan.variants)
    if document is None:
        raise TuneError(
            f"no tune result is kept for {result_key(plan.recipe, plan.variants)} on this host",
            f"run 'sm120 tune {plan.recipe}' first",
        )
    return document


def run_tune(
    request: TuneRequest,
    view: TuneView,
    starter: Callable[[TuneRequest, TuneView], Search] = start_search,
) -> dict[str, Any]:
    """The whole search; the result document (also saved for this host)."""
    if request.rounds < 1:
        raise TuneError("--rounds must be at least 1", "e.g. --rounds 3")
    if request.budget_s <= 0:
        raise TuneError("--budget must be above 0 minutes", "e.g. --budget 30")
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a service manager, a CI timeout) cleans up as Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
    search = starter(request, view)
    view.line(
        f"tuning {search.plan.recipe} for {search.objective.label} on "
        f"{search.workload.describe()}; "
        f"{search.space.size} candidates in a one-knob-at-a-time pass, budget "
        f"{request.budget_s / 60:g} min"
    )
    try:
        return search.run()
    except KeyboardInterrupt:
        raise TuneInterrupted(
            f"interrupted: {len(search.progress.outcomes)} candidates and "
            f"{len(search.progress.pairs)} pairs are kept, and nothing is left running",
            "run the same command again to go on from there",
        ) from None
    finally:
        search.engines.stop_all()
        with contextlib.suppress(OSError):
            search.save()
