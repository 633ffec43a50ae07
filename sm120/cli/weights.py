"""`sm120 download NAME` and `sm120 verify DIR`: get a checkpoint, and check one."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import typer

from sm120.cli.errors import cli_errors, report

if TYPE_CHECKING:
    from sm120.core.errors import SM120Error
    from sm120.plan.resolve import LaunchPlan
    from sm120.weights.verify import WeightsReport


def register(app: typer.Typer) -> None:
    app.command("download")(download)
    app.command("verify")(verify)


def _gb(nbytes: int) -> str:
    from sm120.weights.download import size_text

    return size_text(nbytes)


class DownloadProgress:
    """Download progress on stderr: live bars on a terminal, a line per file otherwise."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.live = self.console.is_terminal
        self.files = 0
        self.finished = 0
        self.tasks: dict[str, Any] = {}
        self.progress: Any = None
        self.overall: Any = None

    def __enter__(self) -> DownloadProgress:
        return self

    def _start(self) -> None:
        # Started at the first file, so a launch with nothing to fetch prints nothing.
        if self.live and self.progress is None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.progress.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _overall_text(self) -> str:
        return f"[bold]{self.finished}/{self.files} files[/bold]"

    def begin(self, files: int, done_files: int, total_bytes: int, done_bytes: int) -> None:
        self.files, self.finished = files, done_files
        self._start()
        if self.progress is not None:
            self.overall = self.progress.add_task(
                self._overall_text(), total=total_bytes, completed=done_bytes
            )
        else:
            self.note(
                f"{files} files, {_gb(total_bytes)}; {done_files} files and "
                f"{_gb(done_bytes)} already here"
            )

    def file_started(self, path: str, size: int, offset: int) -> None:
        if self.progress is not None:
            # The overall bar counted resumed bytes as done at begin().
            self.tasks[path] = self.progress.add_task(f"  {path}", total=size, completed=offset)
        elif offset:
            self.note(f"resuming {path} at {_gb(offset)} of {_gb(size)}")

    def advance(self, path: str, nbytes: int) -> None:
        if self.progress is not None:
            if path in self.tasks:
                self.progress.advance(self.tasks[path], nbytes)
            self.progress.advance(self.overall, nbytes)

    def file_done(self, path: str) -> None:
        self.finished += 1
        if self.progress is not None:
            task = self.tasks.pop(path, None)
            if task is not None:
                self.progress.remove_task(task)
            self.progress.update(self.overall, description=self._overall_text())
        else:
            self.console.print(f"[{self.finished}/{self.files}] {path}", highlight=False)

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]", highlight=False, soft_wrap=True)


def _plan(name: str, variant: list[str], model_dir: str | None) -> LaunchPlan:
    from sm120.plan.request import plan_request
    from sm120.plan.resolve import resolve

    return resolve(plan_request(name, environ=os.environ, variants=variant, model_dir=model_dir))


def _target(plan: LaunchPlan, folder: str | None) -> tuple[str, Path]:
    from sm120.core.errors import SM120Error
    from sm120.weights.ensure import managed_model_dir

    if plan.model.generated is not None:
        raise SM120Error(
            f"recipe '{plan.recipe}' generates its model locally; there is nothing to download",
            f"'sm120 launch {plan.recipe}' builds it",
        )
    if plan.model.repo is None:
        raise SM120Error(
            f"recipe '{plan.recipe}' names no Hugging Face repo (model.repo is null)",
            "set model.repo in the recipe, or fetch the checkpoint yourself and pass --model-dir",
        )
    chosen = folder or plan.model_dir
    return plan.model.repo, Path(chosen) if chosen else managed_model_dir(plan.model.repo)


@cli_errors
def download(
    recipe: str = typer.Argument(..., help="Recipe whose checkpoint to fetch, e.g. glm47."),
    variant: list[str] = typer.Option(
        [], "--variant", "-V", help="Variant(s), in order (some pick another checkpoint)."
    ),
    folder: str | None = typer.Option(
        None, "--dir", help="Target folder (default: the model dir, else SM120_HOME/models/)."
    ),
    offline: bool = typer.Option(
        False, "--offline", help="Use what the folder holds; fail if it is incomplete."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be fetched."),
) -> None:
    """Fetch the recipe's checkpoint at its pinned revision (resumable; HF_TOKEN if needed)."""
    from sm120.weights.download import (
        hub_source,
        offline_by_environment,
        plan_download,
        run_download,
    )
    from sm120.weights.download_record import partial_dir

    plan = _plan(recipe, variant, folder)
    repo, target = _target(plan, folder)
    target = target.expanduser().resolve()
    if offline or offline_by_environment():
        _offline(plan, repo, target)
        return
    source = hub_source(repo, plan.model.revision)
    try:
        with DownloadProgress() as progress:
            download_plan = plan_download(source, target, plan.recipe, progress)
            if plan.model.revision is None:
                progress.note(
                    f"note: recipe '{plan.recipe}' pins no revision: fetching {source.ref} as "
                    f"of commit {download_plan.commit[:10]}"
                )
            if dry_run:
                _show_download_plan(download_plan)
                return
            result = run_download(download_plan, progress)
    except KeyboardInterrupt:
        sys.stderr.write(
            f"interrupted: the bytes fetched so far are kept in {partial_dir(target)}; "
            "run the same command again to resume\n"
        )
        raise typer.Exit(130) from None
    resumed = f", {len(result.resumed)} resumed" if result.resumed else ""
    sys.stderr.write(
        f"fetched {len(result.fetched)} files ({_gb(result.bytes_fetched)}{resumed}), "
        f"{len(result.kept)} already complete\n"
    )
    _verified(target)
    typer.echo(str(target))


def _offline(plan: LaunchPlan, repo: str, target: Path) -> None:
    from sm120.core.errors import SM120Error
    from sm120.weights.ensure import check_local, download_command

    checked = check_local(target, repo, plan.model.revision)
    if not checked.ok:
        raise SM120Error(
            f"offline, and {target} is incomplete: {checked.summary()}",
            f"run '{download_command(plan, target)}' while online",
        )
    typer.echo(str(target))


def _show_download_plan(download_plan: Any) -> None:
    words = {"done": "have", "check": "check", "resume": "resume", "fetch": "fetch"}
    for task in download_plan.tasks:
        detail = f" from {_gb(task.offset)}" if task.action == "resume" else ""
        size = _gb(task.remote.size)
        typer.echo(f"{words[task.action]:<7}{size:>11}  {task.remote.path}{detail}")
    source = download_plan.source
    typer.echo(
        f"would fetch {_gb(download_plan.remaining_bytes)} of {source.repo}@"
        f"{download_plan.commit[:10]} into {download_plan.dest} "
        f"({len(download_plan.pending)} of {len(download_plan.tasks)} files to fetch or check)"
    )


def _verified(target: Path) -> None:
    from sm120.core.errors import SM120Error
    from sm120.weights.verify import verify_dir

    checked = verify_dir(target)
    if not checked.ok:
        raise SM120Error(
            f"downloaded, but {target} still cannot be served: {checked.summary()}",
            f"'sm120 verify {target}' lists every problem",
        )


def weights_for_launch(plan: LaunchPlan, yes: bool) -> Path | None:
    """launch's weights step with the user in the loop (see sm120.weights.ensure)."""
    from sm120.weights.ensure import ensure_weights

    def ask(question: str) -> bool:
        if not sys.stdin.isatty():
            sys.stderr.write("not asking to download: stdin is not a terminal\n")
            return False
        return typer.confirm(question, default=True, err=True)

    try:
        with DownloadProgress() as progress:
            return ensure_weights(plan, ask=None if yes else ask, events=progress)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: the bytes fetched so far are kept; launch again to resume\n")
        raise typer.Exit(130) from None


@cli_errors
def verify(
    folder: Path = typer.Argument(..., help="Checkpoint folder (the one holding config.json)."),
    as_json: bool = typer.Option(False, "--json", help="The report as JSON on stdout."),
) -> None:
    """Check a checkpoint: config.json, and every shard present with its full length."""
    from sm120.core.errors import SM120Error
    from sm120.weights.verify import verify_dir

    if not folder.is_dir():
        raise SM120Error(
            f"{folder} is not a folder", "pass the checkpoint folder (the one holding config.json)"
        )
    checked = verify_dir(folder)
    if as_json:
        typer.echo(json.dumps(checked.as_dict(), indent=2))
    elif checked.ok:
        shards = len(checked.shards)
        typer.echo(
            f"ok  {folder}: config.json and {shards} shard{'s' if shards != 1 else ''}, "
            f"{_gb(checked.total_bytes)}"
        )
    else:
        for problem in checked.problems:
            typer.echo(f"FAIL  {problem}")
    if not checked.ok:
        report(_incomplete(folder, checked))
        raise typer.Exit(1)


def _incomplete(folder: Path, checked: WeightsReport) -> SM120Error:
    from sm120.core.errors import SM120Error
    from sm120.weights.download_record import read_manifest

    manifest = read_manifest(folder)
    name = manifest.recipe if manifest and manifest.recipe else "RECIPE"
    return SM120Error(
        f"{folder} is not a complete checkpoint: {checked.summary()}",
        f"fetch what is missing with 'sm120 download {name} --dir {folder}'",
    )
