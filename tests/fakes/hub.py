"""A local stand-in for the Hugging Face Hub, speaking the part of its HTTP API that
huggingface_hub uses to download a repo (checked against huggingface_hub 2.4's code):

  GET  /api/models/{repo}/revision/{rev}     repo info; `sha` is the commit a ref points at
  GET  /api/models/{repo}/tree/{rev}?recursive=...   the file listing (one page, no Link header)
  HEAD /{repo}/resolve/{rev}/{path}          metadata: X-Repo-Commit, ETag, Content-Length;
                                             LFS files redirect (302) to the CDN with
                                             X-Linked-Etag / X-Linked-Size, as the Hub does
  GET  /{repo}/resolve/{rev}/{path}          regular file bytes (Range supported)
  GET  /cdn/{sha256}                         LFS bytes on another host name (localhost instead
                                             of 127.0.0.1), so clients must drop the token

Errors carry the X-Error-Code header huggingface_hub maps to its exception types. Every
request is recorded with its headers, and faults can be scripted per file: cut the
connection after N bytes, answer with a status, or stall mid-file.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import unquote, urlparse


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    refs: dict[str, str]
    lfs: set[str]
    private: bool
    # Hashed once: the Hub does not hash 200 MB per request either.
    oids: dict[str, str] = field(default_factory=dict)
    shas: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.oids = {path: git_blob_id(data) for path, data in self.files.items()}
        self.shas = {path: hashlib.sha256(self.files[path]).hexdigest() for path in self.lfs}


@dataclass
class FakeHub:
    token: str | None = None  # required by private repos
    repos: dict[str, Repo] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    faults: dict[str, list[str]] = field(default_factory=dict)  # file path -> scripted GETs

    def __post_init__(self) -> None:
        self.release = threading.Event()  # frees stalled responses at shutdown
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def add_repo(
        self,
        repo: str,
        files: dict[str, bytes],
        *,
        commit: str | None = None,
        private: bool = False,
    ) -> str:
        """Publish `files` as one commit that `main` points at; returns the commit id."""
        lfs = {path for path in files if path.endswith((".safetensors", ".bin", ".pth", ".gguf"))}
        published = Repo(dict(files), "", {}, lfs, private)
        digest = hashlib.sha1(repo.encode())
        for path in sorted(files):
            digest.update(path.encode() + published.oids[path].encode())
        published.commit = commit or digest.hexdigest()
        published.refs["main"] = published.commit
        self.repos[repo] = published
        return published.commit

    def fault(self, path: str, *actions: str) -> None:
        """Script the next GETs of a file's bytes: 'cut:N' closes the connection after N
        bytes, 'status:N' answers N, 'stall:N' sends N bytes then waits, 'corrupt' sends
        zeros of the right length; later GETs are served normally."""
        self.faults[path] = list(actions)

    def requests(self, method: str | None = None, contains: str = "") -> list[Seen]:
        return [
            r for r in self.seen if (method is None or r.method == method) and contains in r.path
        ]

    def next_fault(self, path: str) -> str | None:
        with self.lock:
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None


_API = re.compile(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/?]+)(?:/.*)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_CDN = re.compile(r"^/cdn/([0-9a-f]{64})$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: tests read hub.seen instead

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _route(self, body: bool) -> None:
            path = urlparse(self.path).path
            hub.seen.append(
                Seen(self.command, path, {k.lower(): v for k, v in self.headers.items()})
            )
            if match := _API.match(path):
                self._api(match.group(1), match.group(2), unquote(match.group(3)))
            elif match := _RESOLVE.match(path):
                repo, rev, name = match.group(1), unquote(match.group(2)), unquote(match.group(3))
                self._resolve(repo, rev, name, body)
            elif match := _CDN.match(path):
                self._cdn(match.group(1), body)
            else:
                self._error(404, "EntryNotFound")

        # -- helpers -------------------------------------------------------------------------

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            payload = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _json(self, data: object) -> None:
            payload = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _repo(self, name: str) -> Repo | None:
            repo = hub.repos.get(name)
            authorized = self.headers.get("Authorization") == f"Bearer {hub.token}"
            if repo is None or (repo.private and not authorized):
                self._error(401, "RepoNotFound")  # the Hub does not tell private from absent
                return None
            return repo

        def _commit(self, repo: Repo, rev: str) -> str | None:
            commit = repo.refs.get(rev, rev if rev == repo.commit else None)
            if commit is None:
                self._error(404, "RevisionNotFound")
            return commit

        # -- endpoints -----------------------------------------------------------------------

        def _api(self, name: str, kind: str, rev: str) -> None:
            repo = self._repo(name)
            if repo is None:
                return
            commit = self._commit(repo, rev)
            if commit is None:
                return
            if kind == "revision":
                siblings = [{"rfilename": p} for p in sorted(repo.files)]
                self._json(
                    {"id": name, "sha": commit, "private": repo.private, "siblings": siblings}
                )
                return
            entries: list[dict[str, object]] = []
            folders = sorted({p.rsplit("/", 1)[0] for p in repo.files if "/" in p})
            for folder in folders:
                entries.append(
                    {
                        "type": "directory",
                        "oid": git_blob_id(folder.encode()),
                        "size": 0,
                        "path": folder,
                    }
                )
            for path, content in sorted(repo.files.items()):
                entry: dict[str, object] = {
                    "type": "file",
                    "oid": repo.oids[path],
                    "size": len(content),
                    "path": path,
                }
                if path in repo.lfs:
                    lfs = {"oid": repo.shas[path], "size": len(content), "pointerSize": 134}
                    entry["lfs"] = lfs
                entries.append(entry)
            self._json(entries)

        def _resolve(self, name: str, rev: str, path: str, body: bool) -> None:
            repo = self._repo(name)
            if repo is None:
                return
            commit = self._commit(repo, rev)
            if commit is None:
                return
            content = repo.files.get(path)
            if content is None:
                self._error(404, "EntryNotFound", commit)
                return
            if path in repo.lfs:
                sha = repo.shas[path]
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{hub.port}/cdn/{sha}")
                self.send_header("X-Repo-Commit", commit)
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(content)))
                self.send_header("ETag", f'"{repo.oids[path]}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._bytes(
                path, content, body, {"X-Repo-Commit": commit, "ETag": f'"{repo.oids[path]}"'}
            )

        def _cdn(self, sha: str, body: bool) -> None:
            for repo in hub.repos.values():
                for path, known in repo.shas.items():
                    if known == sha:
                        self._bytes(path, repo.files[path], body, {"ETag": f'"{sha}"'})
                        return
            self._error(404, "EntryNotFound")

        def _bytes(self, path: str, content: bytes, body: bool, extra: dict[str, str]) -> None:
            start = 0
            ranged = self.headers.get("Range")
            if ranged and (match := re.match(r"bytes=(\d+)-$", ranged)):
                start = int(match.group(1))
            action = hub.next_fault(path) if body else None
            if action and action.startswith("status:"):
                self._error(int(action.split(":")[1]), "Scripted")
                return
            self.send_response(206 if start else 200)
            for key, value in extra.items():
                self.send_header(key, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(content) - start))
            if start:
                self.send_header(
                    "Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}"
                )
            self.end_headers()
            if not body:
                return
            data = content[start:]
            if action == "corrupt":
                data = bytes(len(data))
            if action and action.startswith(("cut:", "stall:")):
                sent = int(action.split(":")[1])
                self.wfile.write(data[:sent])
                self.wfile.flush()
                if action.startswith("stall:"):
                    hub.release.wait(timeout=120)
                self.close_connection = True
                self.connection.shutdown(2)  # the client sees the body end early
                return
            self.wfile.write(data)

    return Handler


GLM47 = "Salyut1/GLM-4.7-NVFP4"


GLM47_COMMIT = "531df318dbe2877b24881f6e15024c7f945e7048"


GLM52 = "0xSero/GLM-5.2-NVFP4-REAP-469B"


TOKEN = "hf_sEcReT0123456789abcdefTOKEN"
