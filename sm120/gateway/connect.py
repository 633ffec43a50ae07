"""`sm120 connect CLIENT [NAME]`: the settings a coding agent needs to reach this box, as
text to read, `export` lines to eval, or written into the client's own config file.

The endpoint is the gateway when one runs (every deployment behind one key), else the
deployment itself. The key stays in its file: shell lines read it with `cat`, Claude Code
runs `cat` through its `apiKeyHelper`, Codex reads it from the environment variable its
provider names. Only `--show-key` puts the key itself on screen.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

from sm120.core.bounded import read_text_capped
from sm120.core.errors import SM120Error
from sm120.core.net import client_url
from sm120.engine.secrets import key_path, read_api_key
from sm120.engine.state import write_private_atomically
from sm120.gateway.backends import Backend, discover
from sm120.gateway.control import gateway_status
from sm120.gateway.files import GatewayFiles

CLIENTS = ("claude-code", "codex", "openai")
# The provider id and the key's variable in Codex's config.
CODEX_PROVIDER = "sm120"
CODEX_KEY_ENV = "SM120_API_KEY"
# A client's config file is small; anything bigger is not the file we think it is.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# Agents send long prompts: a cold prefill of 100k tokens can take minutes (Claude Code's
# default request timeout is 10 minutes; it is raised to 30).
CLAUDE_TIMEOUT_MS = "1800000"


class ConnectError(SM120Error):
    """No endpoint to connect to, or a client config that cannot be written."""


@dataclass(frozen=True)
class Endpoint:
    """Where a client sends requests: a root URL (no /v1), the key's file, and the models."""

    root_url: str
    key_file: Path
    models: tuple[str, ...]
    via: str

    def key(self) -> str:
        key = read_api_key(str(self.key_file))
        if key is None:
            raise ConnectError(f"the key file {self.key_file} is missing or empty", _START_HINT)
        return key


@dataclass(frozen=True)
class ClientSettings:
    client: str
    endpoint: Endpoint
    model: str
    env: dict[str, str] = field(default_factory=dict)
    # Variables whose value is the key (read from its file unless asked to show it).
    key_env: tuple[str, ...] = ()


_START_HINT = "start a deployment (sm120 launch NAME) or the gateway (sm120 gateway start)"


def find_endpoint(files: GatewayFiles, name: str | None, direct: bool) -> Endpoint:
    """The gateway when it runs (unless `direct`), else the named or only deployment."""
    backends = discover()
    status = gateway_status(files)
    if status.running and status.address is not None and not direct:
        # Served names only: an alias is a name a client already asks for by itself.
        models = tuple(sorted(backends))
        if name is not None:
            models = (_model_of(name, backends),)
        root = client_url(status.address.host, status.address.port)
        return Endpoint(root, files.api_key, models, "the gateway")
    running = {model: b for model, b in backends.items() if b.running}
    if name is not None:
        chosen = [b for b in running.values() if b.deployment == name]
        if not chosen:
            raise ConnectError(
                f"no running deployment is named {name!r}; running: {_names(running)}",
                _START_HINT,
            )
    else:
        chosen = list(running.values())
        if len(chosen) != 1:
            raise ConnectError(
                f"{len(chosen)} deployments run ({_names(running)}) and no gateway: "
                "name one, or start the gateway",
                "sm120 connect CLIENT NAME, or sm120 gateway start",
            )
    backend = chosen[0]
    return Endpoint(
        backend.base_url, key_path(backend.deployment), (backend.model,),
        f"deployment {backend.deployment}",
    )  # fmt: skip


def _model_of(name: str, backends: Mapping[str, Backend]) -> str:
    for model, backend in backends.items():
        if backend.deployment == name:
            return model
    raise ConnectError(
        f"the gateway serves no deployment named {name!r}; deployments: "
        f"{', '.join(sorted({b.deployment for b in backends.values()})) or 'none'}",
        "sm120 status lists them",
    )


def _names(backends: Mapping[str, Backend]) -> str:
    return ", ".join(sorted(b.deployment for b in backends.values())) or "none"


def settings_for(client: str, endpoint: Endpoint, model: str | None) -> ClientSettings:
    if client not in CLIENTS:
        raise ConnectError(f"unknown client {client!r}", f"choose one of {', '.join(CLIENTS)}")
    chosen = model or _only_model(endpoint)
    if client == "claude-code":
        env = {
            # The Anthropic SDK adds /v1/messages itself.
            "ANTHROPIC_BASE_URL": endpoint.root_url,
            "ANTHROPIC_MODEL": chosen,
            # Claude Code's background and sub-agent calls use these model slots: all go to
            # the local model, none to a hosted one the endpoint does not serve.
            "ANTHROPIC_DEFAULT_OPUS_MODEL": chosen,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": chosen,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": chosen,
            "API_TIMEOUT_MS": CLAUDE_TIMEOUT_MS,
            # No telemetry or update checks to hosts this box may not reach.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        return ClientSettings(client, endpoint, chosen, env, ("ANTHROPIC_AUTH_TOKEN",))
    base = endpoint.root_url + "/v1"
    if client == "codex":
        return ClientSettings(client, endpoint, chosen, {}, (CODEX_KEY_ENV,))
    env = {"OPENAI_BASE_URL": base, "OPENAI_MODEL": chosen}
    return ClientSettings(client, endpoint, chosen, env, ("OPENAI_API_KEY",))


def _only_model(endpoint: Endpoint) -> str:
    if len(endpoint.models) == 1:
        return endpoint.models[0]
    listed = ", ".join(endpoint.models) or "none"
    raise ConnectError(
        f"{endpoint.via} serves {len(endpoint.models)} models ({listed}): choose one",
        "name the deployment (sm120 connect CLIENT NAME) or pass --model",
    )


def _key_value(settings: ClientSettings, show_key: bool) -> str:
    if show_key:
        return shlex.quote(settings.endpoint.key())
    return f'"$(cat {shlex.quote(str(settings.endpoint.key_file))})"'


def shell_lines(settings: ClientSettings, show_key: bool) -> list[str]:
    """`export` lines a POSIX shell can eval; the key read from its file unless shown."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in settings.env.items()]
    lines += [f"export {name}={_key_value(settings, show_key)}" for name in settings.key_env]
    if settings.client == "codex":
        lines.append("# and the provider block of 'sm120 connect codex' in ~/.codex/config.toml")
    return lines


def codex_provider(settings: ClientSettings) -> str:
    """The lines of Codex's config.toml that select this endpoint."""
    document = tomlkit.document()
    _set_codex(document, settings)
    return tomlkit.dumps(document)


def _set_codex(document: tomlkit.TOMLDocument, settings: ClientSettings) -> None:
    document["model"] = settings.model
    document["model_provider"] = CODEX_PROVIDER
    providers = document.get("model_providers")
    if providers is None:
        providers = tomlkit.table(is_super_table=True)
        document["model_providers"] = providers
    provider = tomlkit.table()
    provider["name"] = f"sm120 ({settings.endpoint.via})"
    provider["base_url"] = settings.endpoint.root_url + "/v1"
    provider["env_key"] = CODEX_KEY_ENV
    # Codex speaks the Responses API; the gateway and vLLM serve /v1/responses.
    provider["wire_api"] = "responses"
    providers[CODEX_PROVIDER] = provider


def describe(settings: ClientSettings) -> list[str]:
    """What a person reads: where, which model, and where the key is."""
    endpoint = settings.endpoint
    lines = [
        f"{settings.client} -> {endpoint.via} at {endpoint.root_url} (model {settings.model})",
        f"key: in {endpoint.key_file} (sm120 connect ... --show-key prints it)",
    ]
    if settings.client == "codex":
        lines += ["", "~/.codex/config.toml:", codex_provider(settings).rstrip()]
        lines += ["", f'then: export {CODEX_KEY_ENV}="$(cat {endpoint.key_file})"; codex']
        return lines
    lines += ["", "environment:"]
    lines += [f"  {name}={value}" for name, value in settings.env.items()]
    lines += [f"  {name}=<the key>" for name in settings.key_env]
    if settings.client == "claude-code":
        lines += [
            "",
            "or write them into ~/.claude/settings.json: sm120 connect claude-code --write",
        ]
    return lines


def write_client_config(settings: ClientSettings, home: Path) -> tuple[Path, list[str]]:
    """Merge the settings into the client's own config file; where, and what was set."""
    if settings.client == "claude-code":
        return _write_claude(settings, home / ".claude" / "settings.json")
    if settings.client == "codex":
        return _write_codex(settings, home / ".codex" / "config.toml")
    raise ConnectError(
        "the openai client has no config file of its own",
        'use the environment instead: eval "$(sm120 connect openai --shell)"',
    )


def _existing_text(path: Path, what: str) -> str | None:
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConnectError(f"{what} {path} is not a regular file", "move it aside and retry")
    if not path.exists():
        return None
    return read_text_capped(path, MAX_CONFIG_BYTES, what, "move it aside and retry")


def _write_claude(settings: ClientSettings, path: Path) -> tuple[Path, list[str]]:
    text = _existing_text(path, "Claude Code settings")
    try:
        document = json.loads(text) if text and text.strip() else {}
    except ValueError as exc:
        raise ConnectError(
            f"{path} is not JSON ({exc}); nothing was written", "fix or move the file, then retry"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("env", {}), dict):
        raise ConnectError(f"{path} is not a settings object; nothing was written", "fix it")
    env = dict(document.get("env", {}))
    env.update(settings.env)
    # A key in the file would outlive a new one; the helper reads the current key each time.
    removed = [name for name in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY") if name in env]
    for name in removed:
        del env[name]
    document["env"] = env
    document["apiKeyHelper"] = f"cat {shlex.quote(str(settings.endpoint.key_file))}"
    _write(path, json.dumps(document, indent=2) + "\n")
    changed = [*settings.env, "apiKeyHelper"] + [f"{name} (removed)" for name in removed]
    return path, changed


def _write_codex(settings: ClientSettings, path: Path) -> tuple[Path, list[str]]:
    text = _existing_text(path, "Codex config")
    try:
        document = tomlkit.parse(text) if text else tomlkit.document()
    except TOMLKitError as exc:
        raise ConnectError(
            f"{path} is not TOML ({exc}); nothing was written", "fix or move the file, then retry"
        ) from None
    _set_codex(document, settings)
    _write(path, tomlkit.dumps(document))
    return path, ["model", "model_provider", f"[model_providers.{CODEX_PROVIDER}]"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private_atomically(path, text)
