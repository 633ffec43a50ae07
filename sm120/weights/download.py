"""Fetch a model repo at one commit into a plain folder the engine (or a container) can read.

huggingface_hub does the talking: it resolves the revision, lists the tree, reads each file's
metadata (following the Hub's redirect to its CDN, dropping the token when it leaves the Hub)
and streams bytes with retries. sm120 owns where the bytes land. Since huggingface_hub 1.18
a download writes to a temporary file unique to the process and deletes it on failure, so an
interrupted 5 GB shard starts again from zero (huggingface/huggingface_hub#4196). Here the
bytes go to DIR/.sm120/partial/ and stay there until the file is complete and its content hash
matches the Hub's; the next run asks for the rest with an HTTP Range request.

The token comes from HF_TOKEN (else huggingface_hub's own login) and is sent only in the
Authorization header: it is scrubbed from every message this module raises.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
import shutil
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import quote, urlparse

from sm120.core.errors import SM120Error
from sm120.engine.state import private_dir
from sm120.weights.download_record import (
    Manifest,
    RemoteFile,
    download_lock,
    partial_dir,
    read_manifest,
    write_manifest,
)
from sm120.weights.selection import needed_files

DEFAULT_BRANCH = "main"
WORKERS = 8  # huggingface_hub's default for snapshots; a shard per worker saturates most links
COMMIT = re.compile(r"^[0-9a-f]{40}$")
HASH_BLOCK = 8 * 1024 * 1024


class DownloadError(SM120Error):
    """The Hub could not be asked, or a file could not be fetched; partial bytes are kept."""


class DownloadCancelled(Exception):
    """Raised inside a worker when the user interrupted the download."""


@dataclass(frozen=True)
class HubSource:
    repo: str
    revision: str | None  # None: the default branch, whatever it points at today
    token: str | None = field(default=None, repr=False)
    endpoint: str | None = None

    @property
    def ref(self) -> str:
        return self.revision or DEFAULT_BRANCH


def hub_source(repo: str, revision: str | None) -> HubSource:
    """Read the token and endpoint when they are needed (tests and users set them late)."""
    return HubSource(
        repo=repo,
        revision=revision,
        token=os.environ.get("HF_TOKEN") or None,
        endpoint=os.environ.get("HF_ENDPOINT") or None,
    )


def offline_by_environment() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


class DownloadEvents(Protocol):
    """What the progress display hears; called from worker threads."""

    def begin(self, files: int, done_files: int, total_bytes: int, done_bytes: int) -> None: ...
    def file_started(self, path: str, size: int, offset: int) -> None: ...
    def advance(self, path: str, nbytes: int) -> None: ...
    def file_done(self, path: str) -> None: ...
    def note(self, text: str) -> None: ...


class QuietEvents:
    def begin(self, files: int, done_files: int, total_bytes: int, done_bytes: int) -> None:
        pass

    def file_started(self, path: str, size: int, offset: int) -> None:
        pass

    def advance(self, path: str, nbytes: int) -> None:
        pass

    def file_done(self, path: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass


Action = Literal["done", "check", "resume", "fetch"]


@dataclass(frozen=True)
class FileTask:
    remote: RemoteFile
    action: Action  # done: recorded complete; check: present, not recorded; else transfer
    offset: int = 0  # bytes already in the partial file

    @property
    def remaining(self) -> int:
        return 0 if self.action in ("done", "check") else self.remote.size - self.offset


@dataclass(frozen=True)
class DownloadPlan:
    source: HubSource
    dest: Path
    commit: str
    recipe: str | None
    tasks: tuple[FileTask, ...]

    @property
    def total_bytes(self) -> int:
        return sum(task.remote.size for task in self.tasks)

    @property
    def remaining_bytes(self) -> int:
        return sum(task.remaining for task in self.tasks)

    @property
    def pending(self) -> list[FileTask]:
        return [task for task in self.tasks if task.action != "done"]


@dataclass
class DownloadResult:
    dest: Path
    commit: str
    fetched: list[str] = field(default_factory=list)
    resumed: dict[str, int] = field(default_factory=dict)  # path -> offset it resumed from
    kept: list[str] = field(default_factory=list)  # already complete
    bytes_fetched: int = 0


# ---- talking to the Hub ---------------------------------------------------------------------


def scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def _transport_errors() -> tuple[type[BaseException], ...]:
    # huggingface_hub 1.x speaks httpx, 2.x its fork httpx2: catch whichever is installed.
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


@contextmanager
def hub_errors(source: HubSource, what: str) -> Iterator[None]:
    """Hub and network failures as one-line errors that never carry the token."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token_hint = "set HF_TOKEN to a token that can read it (it is never printed)"
    try:
        yield
    except GatedRepoError:
        raise DownloadError(
            f"{source.repo} is gated: its terms must be accepted on the Hub first",
            f"accept them at https://huggingface.co/{source.repo}, then {token_hint}",
        ) from None
    except RepositoryNotFoundError:
        raise DownloadError(
            f"{source.repo} was not found on the Hub, or is private to this token",
            f"check the recipe's model.repo; for a private repo {token_hint}",
        ) from None
    except RevisionNotFoundError:
        raise DownloadError(
            f"{source.repo} has no revision '{source.ref}'",
            "check the recipe's model.revision",
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "an error"
        raise DownloadError(
            f"the Hub answered {status} while {what}",
            "try again later; the bytes fetched so far are kept",
        ) from None
    except _transport_errors() as exc:
        raise DownloadError(
            f"cannot reach the Hub while {what}: {scrub(str(exc), source.token)}",
            "check the network (or HF_ENDPOINT), then run again; the bytes fetched so far are kept",
        ) from None


class _NoteHandler(logging.Handler):
    def __init__(self, events: DownloadEvents, token: str | None) -> None:
        super().__init__(logging.WARNING)
        self.events = events
        self.token = token

    def emit(self, record: logging.LogRecord) -> None:
        lines = record.getMessage().splitlines()
        self.events.note(scrub(" ".join(lines[:2]), self.token))


@contextmanager
def hub_log_notes(events: DownloadEvents, token: str | None) -> Iterator[None]:
    """huggingface_hub's warnings (retries, resumes) as progress notes rather than log lines
    written over the progress display; HF_HUB_VERBOSITY keeps its own logging as it is."""
    logger = logging.getLogger("huggingface_hub")
    if os.environ.get("HF_HUB_VERBOSITY"):
        yield
        return
    saved = logger.handlers[:]
    logger.handlers = [_NoteHandler(events, token)]
    try:
        yield
    finally:
        logger.handlers = saved


def resolve_commit(source: HubSource) -> str:
    if source.revision and COMMIT.match(source.revision):
        return source.revision
    from huggingface_hub import HfApi

    api = HfApi(endpoint=source.endpoint, token=source.token)
    with hub_errors(source, f"resolving {source.repo}@{source.ref}"):
        info = api.repo_info(source.repo, revision=source.ref)
    if not info.sha:
        raise DownloadError(f"the Hub did not say which commit {source.ref} is", "run again")
    return info.sha


def list_files(source: HubSource, commit: str) -> list[RemoteFile]:
    """The files the engine needs at `commit` (see files.py for which)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=source.endpoint, token=source.token)
    with hub_errors(source, f"listing the files of {source.repo}"):
        entries = [
            entry
            for entry in api.list_repo_tree(source.repo, recursive=True, revision=commit)
            if isinstance(entry, RepoFile)
        ]
    by_path = {entry.path: entry for entry in entries}
    unsafe = [path for path in by_path if path.startswith("/") or ".." in path.split("/")]
    if unsafe:
        raise DownloadError(
            f"the Hub listed a path outside the repo: {unsafe[0]}", "check HF_ENDPOINT"
        )
    files = []
    for path in sorted(needed_files(by_path)):
        entry = by_path[path]
        lfs = entry.lfs
        files.append(RemoteFile(path, entry.size, entry.blob_id, lfs.sha256 if lfs else None))
    return files


# ---- what is already here -------------------------------------------------------------------


def partial_path(dest: Path, remote: RemoteFile) -> Path:
    # Keyed by content id: bytes of another version of the file are never appended to.
    return partial_dir(dest) / f"{quote(remote.path, safe='')}.{remote.oid}.part"


def _task(dest: Path, remote: RemoteFile, manifest: Manifest | None) -> FileTask:
    if manifest is not None and manifest.is_done(remote, dest):
        return FileTask(remote, "done")
    target = dest / remote.path
    if target.is_file() and target.stat().st_size == remote.size:
        return FileTask(remote, "check")
    part = partial_path(dest, remote)
    offset = part.stat().st_size if part.is_file() else 0
    if 0 < offset <= remote.size:
        return FileTask(remote, "resume", offset)
    return FileTask(remote, "fetch")


def plan_download(
    source: HubSource,
    dest: Path,
    recipe: str | None = None,
    events: DownloadEvents | None = None,
) -> DownloadPlan:
    """Ask the Hub what the commit holds and compare with the folder; writes nothing."""
    with hub_log_notes(events or QuietEvents(), source.token):
        commit = resolve_commit(source)
        remote_files = list_files(source, commit)
    if not remote_files:
        raise DownloadError(
            f"{source.repo}@{commit[:10]} has no files the engine can load",
            "check the recipe's model.repo: sm120 downloads safetensors checkpoints",
        )
    manifest = read_manifest(dest)
    if manifest is not None and manifest.repo != source.repo:
        raise DownloadError(
            f"{dest} holds a download of {manifest.repo}, not {source.repo}",
            "pick another --dir",
        )
    tasks = tuple(_task(dest, remote, manifest) for remote in remote_files)
    return DownloadPlan(source, dest, commit, recipe, tasks)


# ---- moving bytes ---------------------------------------------------------------------------


def git_blob_id(path: Path) -> str:
    """The object id git (and the Hub's tree listing) gives a file's content."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # git's object id, not security
    _hash_file(path, digest)
    return digest.hexdigest()


def _hash_file(path: Path, digest: Any) -> None:
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)


def content_matches(path: Path, remote: RemoteFile) -> bool:
    if remote.sha256:
        digest = hashlib.sha256()
        _hash_file(path, digest)
        return bool(digest.hexdigest() == remote.sha256)
    return git_blob_id(path) == remote.oid


def _progress_bar(events: DownloadEvents, path: str, stop: threading.Event) -> type:
    """A stand-in for the tqdm class huggingface_hub reports bytes to."""

    class Bar:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def update(self, n: float | None = 1) -> None:
            if stop.is_set():
                raise DownloadCancelled
            events.advance(path, int(n or 0))

        def close(self) -> None:
            pass

    return Bar


def _same_host(a: str, b: str) -> bool:
    return urlparse(a).hostname == urlparse(b).hostname


class _Transfer:
    """One download run: workers fetch files; the manifest records each completed one."""

    def __init__(self, plan: DownloadPlan, events: DownloadEvents, stop: threading.Event):
        self.plan = plan
        self.events = events
        self.stop = stop
        self.lock = threading.Lock()
        self.result = DownloadResult(plan.dest, plan.commit)
        previous = read_manifest(plan.dest)
        self.manifest = Manifest(
            repo=plan.source.repo,
            revision=plan.source.revision,
            commit=plan.commit,
            recipe=plan.recipe,
            files={task.remote.path: task.remote for task in plan.tasks},
            done=dict(previous.done) if previous and previous.repo == plan.source.repo else {},
        )

    def record_done(self, remote: RemoteFile) -> None:
        with self.lock:
            self.manifest.done[remote.path] = remote.oid
            write_manifest(self.plan.dest, self.manifest)
        self.events.file_done(remote.path)

    def run(self, task: FileTask) -> None:
        remote = task.remote
        if task.action == "check":
            self.events.note(f"checking {remote.path} already in the folder")
            if content_matches(self.plan.dest / remote.path, remote):
                with self.lock:
                    self.result.kept.append(remote.path)
                self.record_done(remote)
                return
        self.fetch(remote)

    def fetch(self, remote: RemoteFile) -> None:
        from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get
        from huggingface_hub.utils._headers import build_hf_headers

        source, dest = self.plan.source, self.plan.dest
        url = hf_hub_url(
            source.repo, remote.path, revision=self.plan.commit, endpoint=source.endpoint
        )
        with hub_errors(source, f"asking for {remote.path}"):
            meta = get_hf_file_metadata(url, token=source.token, endpoint=source.endpoint)
        location = meta.location or url
        headers = build_hf_headers(token=source.token)
        if not _same_host(url, location):
            headers.pop("authorization", None)  # the CDN gets a signed URL, never the token
        part = partial_path(dest, remote)
        part.parent.mkdir(parents=True, exist_ok=True)
        offset = part.stat().st_size if part.is_file() else 0
        if offset > remote.size:
            part.unlink()
            offset = 0
        self.events.file_started(remote.path, remote.size, offset)
        with hub_errors(source, f"downloading {remote.path}"), part.open("ab") as handle:
            http_get(
                location,
                handle,
                resume_size=offset,
                headers=headers,
                expected_size=remote.size,
                displayed_filename=remote.path,
                tqdm_class=_progress_bar(self.events, remote.path, self.stop),
            )
        if not content_matches(part, remote):
            part.unlink()
            raise DownloadError(
                f"{remote.path} does not match the Hub's checksum (the partial file was removed)",
                "run the download again",
            )
        target = dest / remote.path
        target.parent.mkdir(parents=True, exist_ok=True)
        part.replace(target)
        with self.lock:
            self.result.fetched.append(remote.path)
            self.result.bytes_fetched += remote.size - offset
            if offset:
                self.result.resumed[remote.path] = offset
        self.record_done(remote)


def size_text(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 10**7 else f"{nbytes / 1e6:.2f} MB"


def _check_disk_space(plan: DownloadPlan) -> None:
    free = shutil.disk_usage(plan.dest).free
    if free < plan.remaining_bytes:
        raise DownloadError(
            f"{plan.dest} has {size_text(free)} free; the download needs "
            f"{size_text(plan.remaining_bytes)} more",
            "free some space, or pick a folder on a larger disk with --dir",
        )


def run_download(
    plan: DownloadPlan,
    events: DownloadEvents | None = None,
    *,
    workers: int = WORKERS,
    stop: threading.Event | None = None,
) -> DownloadResult:
    """Fetch what `plan` lacks. Ctrl-C stops the workers and keeps their bytes for next time."""
    events = events or QuietEvents()
    stop = stop or threading.Event()
    private_dir(plan.dest)  # under $SM120_HOME: models/ and each model 0700
    with download_lock(plan.dest), hub_log_notes(events, plan.source.token):
        _drop_stale_parts(plan)
        _check_disk_space(plan)
        transfer = _Transfer(plan, events, stop)
        write_manifest(plan.dest, transfer.manifest)
        done = [task for task in plan.tasks if task.action == "done"]
        transfer.result.kept += [task.remote.path for task in done]
        done_bytes = plan.total_bytes - plan.remaining_bytes
        events.begin(len(plan.tasks), len(done), plan.total_bytes, done_bytes)
        failures = _run_workers(transfer, plan.pending, workers, stop)
    if failures:
        first_path, first_error = failures[0]
        more = f" (and {len(failures) - 1} more files)" if len(failures) > 1 else ""
        raise DownloadError(
            scrub(_message(first_path, first_error), plan.source.token) + more,
            "run the download again: it resumes where it stopped",
        )
    return transfer.result


def _message(path: str, error: BaseException) -> str:
    if isinstance(error, SM120Error):
        return error.message  # names the file already; the hint is the caller's
    text = str(error).splitlines()[0] if str(error) else error.__class__.__name__
    return f"{path}: {text}"


def _drop_stale_parts(plan: DownloadPlan) -> None:
    """Partial files of content no longer wanted (an older revision) only take space."""
    folder = partial_dir(plan.dest)
    if not folder.is_dir():
        return
    wanted = {partial_path(plan.dest, task.remote) for task in plan.tasks}
    for part in folder.glob("*.part"):
        if part not in wanted:
            part.unlink()


def _run_workers(
    transfer: _Transfer, tasks: list[FileTask], workers: int, stop: threading.Event
) -> list[tuple[str, BaseException]]:
    """Daemon threads: a worker stuck on a stalled connection cannot keep Ctrl-C from ending
    the process. What they appended so far is a prefix of the file, which is all a resume
    needs (and the checksum at the end guards the rest)."""
    # Largest first: the long shards start early and small files fill the gaps.
    queue = deque(sorted(tasks, key=lambda task: task.remaining, reverse=True))
    failures: list[tuple[str, BaseException]] = []
    lock = threading.Lock()

    def work() -> None:
        while not stop.is_set():
            with lock:
                if not queue:
                    return
                task = queue.popleft()
            try:
                transfer.run(task)
            except DownloadCancelled:
                return
            except Exception as error:  # reported together at the end; the others go on
                with lock:
                    failures.append((task.remote.path, error))

    threads = [
        threading.Thread(target=work, name=f"sm120-download-{n}", daemon=True)
        for n in range(max(1, min(workers, len(queue))))
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # short joins keep the main thread interruptible
    except BaseException:
        stop.set()
        raise
    return failures
