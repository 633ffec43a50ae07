"""Writing what `sm120 compose` asks for: one recipe's standalone compose file (to a file or
back as text for stdout), or a project: the compose file, the gateway's backends file and one
key file per service plus the gateway's, all beside each other (compose resolves ./ against
the compose file's folder). Existing keys are kept, so clients keep working across rewrites."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from sm120.compose.members import ComposeError, ComposeProject, build_project
from sm120.compose.request import ComposeRequest
from sm120.engine.secrets import read_api_key
from sm120.engine.state import write_private_atomically
from sm120.gateway.static import StaticBackend, backends_document
from sm120.images.context import source_root
from sm120.images.facts import load_facts
from sm120.plan.request import plan_request
from sm120.plan.resolve import LaunchPlan, resolve
from sm120.render.compose import render_compose_file
from sm120.render.compose_project import (
    BACKENDS_FILE,
    GATEWAY_KEY,
    SECRET_MOUNT,
    SECRETS_DIR,
    backend_url,
    key_secret,
    render_compose_project,
)


@dataclass(frozen=True)
class Composed:
    """What `write_compose` did: the compose file's text when it goes to stdout, else the
    file(s) written and, for a project, where its gateway listens."""

    text: str | None = None
    output: Path | None = None
    written: tuple[Path, ...] = ()
    gateway_url: str | None = None

    def notes(self) -> list[str]:
        """What to tell the person (on stderr): the files written and how to start them."""
        if self.output is None:
            return []
        if self.gateway_url is None:
            return [f"wrote {self.output} (docker compose -f {self.output} up)"]
        return [
            *(f"wrote {path}" for path in self.written),
            f"gateway on {self.gateway_url} (its key: {self.output.parent}/{SECRETS_DIR}/"
            f"{GATEWAY_KEY}); docker compose -f {self.output} up",
        ]


def write_compose(request: ComposeRequest) -> Composed:
    """One recipe's compose file, or a project when the request is one (`is_project`)."""
    if request.is_project:
        return _write_project_of(request)
    plan = resolve(
        plan_request(
            request.recipes[0],
            environ=request.environ,
            variants=request.variants,
            model_dir=request.model_dir,
            port=request.port,
        )
    )
    text = render_compose_file(plan, image_caches(plan))
    if request.output is None:
        return Composed(text=text)
    try:
        request.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ComposeError(
            f"cannot write {request.output}: {exc.strerror or exc}",
            "pass -o a file in a folder that exists and is writable, or leave -o out",
        ) from None
    return Composed(output=request.output, written=(request.output,))


def _write_project_of(request: ComposeRequest) -> Composed:
    if request.variants or request.model_dir or request.port is not None:
        raise ComposeError(
            "--variant, --model-dir and --port apply to one recipe, not a project",
            "with several recipes use --ports NAME=PORT; their variants are the defaults",
        )
    if request.output is None:
        raise ComposeError(
            "a compose project is written with its key files beside it, not to stdout",
            "pass -o FOLDER/compose.yaml",
        )
    project = build_project(request, image_caches)
    written = write_project(project, request.output)
    gateway = project.gateway
    return Composed(
        output=request.output,
        written=tuple(written),
        gateway_url=f"http://{gateway.host}:{gateway.port}/v1",
    )


def image_caches(plan: LaunchPlan) -> dict[str, str]:
    """Where the plan's image writes caches (its image.yaml); none for a published image."""
    if plan.image.build != "dockerfile" or not plan.image.context:
        return {}
    return dict(load_facts(source_root() / "images" / plan.image.context).caches)


def backends_of(project: ComposeProject) -> list[StaticBackend]:
    return [
        StaticBackend(
            model=m.plan.model.served_name,
            service=m.service,
            url=backend_url(m, project.host_network),
            key_file=f"{SECRET_MOUNT}/{key_secret(m.service)}",
        )
        for m in project.members
    ]


def write_project(project: ComposeProject, output: Path) -> list[Path]:
    """Write everything; return the files written (keys are never printed, only named)."""
    folder = output.parent
    text = render_compose_project(
        project.members, project.gateway, host_network=project.host_network
    )
    try:
        keys = folder / SECRETS_DIR
        keys.mkdir(mode=0o700, exist_ok=True)
        keys.chmod(0o700)
        written = [_ensure_key(keys / GATEWAY_KEY)]
        written += [_ensure_key(keys / key_secret(m.service)) for m in project.members]
        backends = folder / BACKENDS_FILE
        backends.write_text(backends_document(backends_of(project)), encoding="utf-8")
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ComposeError(
            f"cannot write {exc.filename or output}: {exc.strerror or exc}",
            "pass -o a file in a folder that exists and is writable",
        ) from None
    return [output, backends, *written]


def _ensure_key(path: Path) -> Path:
    if read_api_key(str(path), "delete it; sm120 compose writes a new key") is None:
        write_private_atomically(path, secrets.token_urlsafe(32))
    return path
