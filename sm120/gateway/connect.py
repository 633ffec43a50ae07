"""`sm120 connect CLIENT [NAME]`: the settings a coding agent needs to reach this box, as
text to read, `export` lines to eval, or written into the client's own config files.

The endpoint is the gateway when one runs (every running deployment behind one key), else the
deployment itself. The key stays in its file: shell lines read it with `cat`, Claude Code runs
`cat` through its `apiKeyHelper`, Codex through its provider's `auth` command (so a new shell
finds it too). Only `--show-key` puts the key itself on screen.

The user's own settings are kept: Codex gets a profile file of its own (`codex -p sm120`)
and its `config.toml` is never touched; Claude Code has one settings file, so what sm120
replaces there is named, the file is backed up first, and `--undo` puts it back
(sm120.gateway.connect_files).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from sm120.core.net import client_url
from sm120.engine.secrets import key_path, read_api_key
from sm120.gateway.aliases import Alias, resolve
from sm120.gateway.backends import Backend, discover
from sm120.gateway.clients import agent_client
from sm120.gateway.connect_files import (
    ConnectError,
    Written,
    client_folder,
    existing_text,
    load_record,
    write_client_file,
)
from sm120.gateway.control import gateway_status
from sm120.gateway.files import GatewayFiles

__all__ = ["ConnectError"]

CLIENTS = ("claude-code", "codex", "openai")
# The provider id, and the profile (`codex -p sm120`: $CODEX_HOME/sm120.config.toml). Not
# "sm120": older versions of connect wrote a [model_providers.sm120] with env_key into the
# user's config.toml, and the profile's table would be merged over it.
CODEX_PROVIDER = "sm120-local"
CODEX_PROFILE = "sm120"
CODEX_KEY_ENV = "SM120_API_KEY"
# Agents send long prompts: a cold prefill of 100k tokens can take minutes (Claude Code's
# default request timeout is 10 minutes; it is raised to 30).
CLAUDE_TIMEOUT_MS = "1800000"
# Codex drops a stream that is silent this long; a long cold prefill is silent until its
# first token, so it gets the same 30 minutes.
CODEX_STREAM_IDLE_MS = 1_800_000
# Claude Code reads CLAUDE_CODE_AUTO_COMPACT_WINDOW as at least this many tokens.
CLAUDE_MIN_COMPACT_WINDOW = 100_000
# An answer's share of the window (what CLAUDE_CODE_MAX_OUTPUT_TOKENS asks for), capped.
OUTPUT_SHARE = 4
MAX_OUTPUT_TOKENS = 32_000
# A model name as clients send it: no spaces, quotes or control bytes, bounded.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}")
# Names Claude Code knows and so gives its own window, whatever the settings say.
_CLAUDE_KNOWN = re.compile(r"claude-|(opus|sonnet|haiku)$")
_START_HINT = "start a deployment (sm120 launch NAME) or the gateway (sm120 gateway start)"


@dataclass(frozen=True)
class Endpoint:
    """Where a client sends requests: a root URL (no /v1), the key's file, and the models."""

    root_url: str
    key_file: Path
    models: tuple[str, ...]
    via: str
    # The deployments behind the models, for what a client should know of them.
    backends: tuple[Backend, ...] = ()
    # The gateway's aliases: a name a client asks for that reaches one of the backends.
    aliases: tuple[Alias, ...] = ()

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
    # The deployment the model reaches (through an alias or not); None: not known.
    served: Backend | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Variables whose value is the key (read from its file unless asked to show it).
    key_env: tuple[str, ...] = ()


def find_endpoint(files: GatewayFiles, name: str | None, direct: bool) -> Endpoint:
    """The gateway when it runs (unless `direct`), else the named or only deployment."""
    backends = discover()
    running = {model: b for model, b in backends.items() if b.running}
    status = gateway_status(files)
    if status.running and status.address is not None and not direct:
        # Running deployments only: a stopped one is started by the gateway when asked for
        # by name, never offered as a choice. An alias is a name a client asks for itself.
        models = tuple(sorted(running))
        if name is not None:
            models = (_model_of(name, backends),)
        root = client_url(status.address.host, status.address.port)
        aliases = tuple(Alias(n, t) for n, t in status.address.aliases.items())
        return Endpoint(root, files.api_key, models, "the gateway", tuple(backends.values()),
                        aliases)  # fmt: skip
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
        f"deployment {backend.deployment}", (backend,),
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
    if not _MODEL_NAME.fullmatch(chosen):
        raise ConnectError(
            f"model name {chosen!r} is not a model name",
            "letters, digits and . _ : / @ + = - (up to 200), e.g. --model tiny",
        )
    served = served_backend(chosen, endpoint)
    _check_context(client, served)
    if client == "claude-code":
        env = _claude_env(endpoint, chosen, served)
        return ClientSettings(client, endpoint, chosen, served, env, ("ANTHROPIC_AUTH_TOKEN",))
    if client == "codex":
        return ClientSettings(client, endpoint, chosen, served, {}, (CODEX_KEY_ENV,))
    env = {"OPENAI_BASE_URL": endpoint.root_url + "/v1", "OPENAI_MODEL": chosen}
    return ClientSettings(client, endpoint, chosen, served, env, ("OPENAI_API_KEY",))


def served_backend(model: str, endpoint: Endpoint) -> Backend | None:
    """The deployment `model` reaches: a served name, or an alias of the gateway's."""
    by_model = {backend.model: backend for backend in endpoint.backends}
    if model in by_model:
        return by_model[model]
    deployment_of = {name: backend.deployment for name, backend in by_model.items()}
    found = resolve(model, endpoint.aliases, by_model, deployment_of)
    return found[1] if found is not None else None


def _check_context(client: str, served: Backend | None) -> None:
    """Refused before the client is pointed at a deployment that cannot hold its own prompt:
    Claude Code's ends in 'Prompt is too long' seconds later, with nothing said of why."""
    known = agent_client(client)
    if known is None or served is None or served.max_model_len is None:
        return
    if served.max_model_len >= known.needs_tokens:
        return
    raise ConnectError(
        f"deployment {served.deployment} holds {served.max_model_len:,} tokens; {client}'s "
        f"own prompt is ~{known.prompt_tokens:,} (with a reply: {known.needs_tokens:,})",
        f"relaunch it with a larger context: sm120 launch RECIPE --set "
        f"max-model-len={_round_up(known.needs_tokens)} (tiny: sm120 launch tiny -V agent), "
        "then rerun sm120 connect",
    )


def _round_up(tokens: int) -> int:
    size = 1024
    while size < tokens:
        size *= 2
    return size


def _claude_env(endpoint: Endpoint, chosen: str, served: Backend | None) -> dict[str, str]:
    known = agent_client("claude-code")
    env = {
        # The Anthropic SDK adds /v1/messages itself.
        "ANTHROPIC_BASE_URL": endpoint.root_url,
        # Every model slot gets the name the user chose (an alias stays an alias): Claude
        # Code's background and sub-agent calls go to the local model, none to a hosted one.
        "ANTHROPIC_MODEL": chosen,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": chosen,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": chosen,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": chosen,
        "API_TIMEOUT_MS": CLAUDE_TIMEOUT_MS,
        # No telemetry or update checks to hosts this box may not reach.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # No per-request billing line at the head of the system prompt: it would change
        # every request's first bytes and so miss the engine's prefix cache (older vLLM
        # does not strip it; 0.32 does). Read in Claude Code 2.1.332's own strings.
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    }
    if known is not None:
        # Its own default is 10 retries with backoff: minutes of silence for a wrong key or
        # a gateway that is down.
        env["CLAUDE_CODE_MAX_RETRIES"] = str(known.max_retries)
    window = served.max_model_len if served is not None else None
    if window:
        # A model name Claude Code does not know gets its default window; this is the real
        # one, so it compacts the conversation in time.
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(window)
        if window >= CLAUDE_MIN_COMPACT_WINDOW:
            # Read for every name, known ones too; below 100k it reads as 100k, so it is
            # left out there (MAX_CONTEXT_TOKENS carries the window).
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(window)
        prompt = known.prompt_tokens if known is not None else 0
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(output_tokens(window, prompt))
    return env


def output_tokens(window: int, prompt_tokens: int) -> int:
    """What an answer may ask for: a quarter of the window, so a long conversation still
    fits beside it, and never more than the window leaves beside the client's own prompt
    (vLLM refuses a request whose prompt plus max_tokens exceeds the window)."""
    return max(1, min(MAX_OUTPUT_TOKENS, window // OUTPUT_SHARE, window - prompt_tokens))


def warnings_for(settings: ClientSettings) -> list[str]:
    """What will break for an agent on this deployment, said before the agent finds out."""
    served = settings.served
    found: list[str] = []
    if served is not None and served.auto_tool_choice is False:
        found.append(
            f"deployment {served.deployment} runs without --enable-auto-tool-choice: "
            f"{settings.client}'s tool requests ('tool_choice: auto') get a 400 from vLLM; "
            "relaunch with --set enable-auto-tool-choice=true --set tool-call-parser=PARSER "
            "(the recipe's parser, e.g. glm47 for GLM, hermes for the tiny model)"
        )
    window = served.max_model_len if served is not None else None
    if (
        settings.client == "claude-code"
        and served is not None
        and window is not None
        and window < CLAUDE_MIN_COMPACT_WINDOW
        and _CLAUDE_KNOWN.search(settings.model)
    ):
        found.append(
            f"Claude Code knows the name {settings.model!r} and assumes its own context "
            f"window for it, not the {window:,} tokens deployment {served.deployment} holds: "
            f"pass --model {served.model} so it compacts in time"
        )
    return found


def _only_model(endpoint: Endpoint) -> str:
    if len(endpoint.models) == 1:
        return endpoint.models[0]
    listed = ", ".join(endpoint.models) or "none"
    raise ConnectError(
        f"{endpoint.via} serves {len(endpoint.models)} running models ({listed}): choose one",
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
        lines.append(f"# and the profile of 'sm120 connect codex --write': {codex_then()}")
    return lines


def codex_profile(settings: ClientSettings) -> str:
    """The whole of Codex's profile file (`codex -p sm120`): sm120's provider and model."""
    known = agent_client("codex")
    document = tomlkit.document()
    document.add(tomlkit.comment("Written by `sm120 connect codex --write`: `codex -p sm120`."))
    document.add(tomlkit.comment("Your own ~/.codex/config.toml is left as it is."))
    document["model"] = settings.model
    document["model_provider"] = CODEX_PROVIDER
    window = settings.served.max_model_len if settings.served is not None else None
    if window:
        document["model_context_window"] = window
    provider = tomlkit.table()
    provider["name"] = f"sm120 ({settings.endpoint.via})"
    provider["base_url"] = settings.endpoint.root_url + "/v1"
    # Codex speaks the Responses API; the gateway and vLLM serve /v1/responses.
    provider["wire_api"] = "responses"
    if known is not None:
        provider["request_max_retries"] = known.max_retries
        provider["stream_max_retries"] = known.max_retries
    provider["stream_idle_timeout_ms"] = CODEX_STREAM_IDLE_MS
    # The key is read from its file by the command each time Codex needs it: a new shell
    # finds it, and it never sits in the environment or this file.
    auth = tomlkit.table()
    auth["command"] = "cat"
    auth["args"] = [str(settings.endpoint.key_file)]
    provider["auth"] = auth
    providers = tomlkit.table(is_super_table=True)
    providers[CODEX_PROVIDER] = provider
    document["model_providers"] = providers
    return tomlkit.dumps(document)


def codex_then() -> str:
    return f"codex -p {CODEX_PROFILE}"


def describe(settings: ClientSettings) -> list[str]:
    """What a person reads: where, which model, and where the key is."""
    endpoint = settings.endpoint
    lines = [
        f"{settings.client} -> {endpoint.via} at {endpoint.root_url} (model {settings.model})",
        f"key: in {endpoint.key_file} (sm120 connect ... --show-key prints it)",
    ]
    if settings.client == "codex":
        lines += ["", f"~/.codex/{CODEX_PROFILE}.config.toml (a profile of its own):"]
        lines += [codex_profile(settings).rstrip()]
        lines += ["", f"write it: sm120 connect codex --write; then: {codex_then()}"]
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
    """Write the client's settings where it reads them; where, and what was set."""
    if settings.client == "claude-code":
        return _write_claude(settings, home / ".claude" / "settings.json")
    if settings.client == "codex":
        return _write_codex(settings, home / ".codex" / f"{CODEX_PROFILE}.config.toml")
    raise ConnectError(
        "the openai client has no config file of its own",
        'use the environment instead: eval "$(sm120 connect openai --shell)"',
    )


def _stamp(settings: ClientSettings) -> Written:
    served = settings.served
    return Written(
        settings.client, "", None, "", served.deployment if served else None, settings.model,
        served.max_model_len if served else None, 0.0,
    )  # fmt: skip


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _write_claude(settings: ClientSettings, path: Path) -> tuple[Path, list[str]]:
    client_folder(path.parent)
    text = existing_text(path, "Claude Code settings")
    try:
        # NaN and Infinity are not JSON: read back, they would be written out as invalid JSON.
        document = json.loads(text, parse_constant=_no_constants) if text and text.strip() else {}
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConnectError(
            f"{path} is not JSON ({reason}); nothing was written",
            "fix or move the file, then retry",
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("env", {}), dict):
        raise ConnectError(f"{path} is not a settings object; nothing was written", "fix it")
    env = dict(document.get("env", {}))
    replaced = [
        f"{name} (was {env[name]!r})"
        for name, value in settings.env.items()
        if name in env and env[name] != value and name.endswith("_MODEL")
    ]
    env.update(settings.env)
    # A key in the file would win over the helper and outlive a new key; the helper reads
    # the current key each time. The file's old text is in the backup.
    removed = [name for name in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY") if name in env]
    for name in removed:
        del env[name]
    document["env"] = env
    document["apiKeyHelper"] = f"cat {shlex.quote(str(settings.endpoint.key_file))}"
    written = json.dumps(document, indent=2, allow_nan=False) + "\n"
    write_client_file(path, written, text, _stamp(settings))
    changed = [*settings.env, "apiKeyHelper"] + [f"{name} (removed)" for name in removed]
    return path, changed + [f"replaced {item}" for item in replaced]


def _write_codex(settings: ClientSettings, path: Path) -> tuple[Path, list[str]]:
    client_folder(path.parent)
    previous = existing_text(path, "Codex profile")
    write_client_file(path, codex_profile(settings), previous, _stamp(settings))
    return path, [
        "model", "model_provider", "model_context_window", f"[model_providers.{CODEX_PROVIDER}]",
    ]  # fmt: skip


def stale_writes(backends: Mapping[str, Backend] | None = None) -> list[str]:
    """Client files written for a context window the deployment no longer has (relaunched
    with another --max-model-len): one line each, naming the rerun."""
    record = load_record()
    if not record:
        return []
    found = discover() if backends is None else backends
    by_deployment = {backend.deployment: backend for backend in found.values()}
    lines = []
    for entry in record.values():
        backend = by_deployment.get(entry.deployment or "")
        if backend is None or backend.max_model_len == entry.max_model_len:
            continue
        lines.append(
            f"{entry.path} was written for {entry.deployment}'s "
            f"{_tokens(entry.max_model_len)} context; it now has "
            f"{_tokens(backend.max_model_len)}: rerun sm120 connect {entry.client} --write"
        )
    return lines


def _tokens(window: int | None) -> str:
    return f"{window:,}-token" if window else "default"
