"""Writing a compose project: the compose file, the gateway's backends file and one key file
per service plus the gateway's, all beside each other (compose resolves ./ against the
compose file's folder). Existing keys are kept, so clients keep working across rewrites."""

from __future__ import annotations

import secrets
from pathlib import Path

from sm120.compose.members import ComposeError, ComposeProject
from sm120.engine.secrets import read_api_key
from sm120.engine.state import write_private_atomically
from sm120.gateway.static import StaticBackend, backends_document
from sm120.render.compose_project import (
    BACKENDS_FILE,
    GATEWAY_KEY,
    SECRET_MOUNT,
    SECRETS_DIR,
    backend_url,
    key_secret,
    render_compose_project,
)


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
    if read_api_key(str(path)) is None:
        write_private_atomically(path, secrets.token_urlsafe(32))
    return path
