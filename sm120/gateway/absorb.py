"""What the gateway absorbs of an engine build's own bugs for coding agents
(sm120/data/engine_fixes.yaml): a request body rewritten for the one engine that needs it,
or a clear answer where the engine would give a bare one.

A deployment carries the fixes of its engine build (`Backend.fixes`, read once from its
launch spec); one without any keeps the fast path exactly as before. Every rewrite is pure (the
input is never mutated) and is named in the returned list, as sm120.gateway.normalize does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from packaging.specifiers import SpecifierSet
from pydantic import BaseModel, ConfigDict, model_validator

from sm120.core.yaml_data import load_yaml
from sm120.recipe.endpoints import release_of

DATA_FILE = "engine_fixes.yaml"
MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"

MERGE_INLINE_SYSTEM = "merge_inline_system"
THINKING_TO_TEMPLATE = "thinking_to_template"
EXPLAIN_RESPONSE_STORE = "explain_response_store"

MERGED_SYSTEM = "merged {count} mid-conversation system message(s) into the system prompt"
MAPPED_THINKING = "mapped thinking.type={kind} to chat_template_kwargs"


class _Fix(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str
    failure: str
    engines: dict[str, str]
    source: str
    template_kwargs: tuple[str, ...] = ()
    store_env: str | None = None

    @model_validator(mode="after")
    def _specifiers(self) -> _Fix:
        for text in self.engines.values():
            SpecifierSet(text)  # raises on a malformed specifier
        return self

    def holds_for(self, engine: str, version: str) -> bool:
        specifier = self.engines.get(engine)
        release = release_of(version)
        return (
            specifier is not None
            and release is not None
            and release in SpecifierSet(specifier, prereleases=True)
        )


class _Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fixes: dict[str, _Fix]

    @model_validator(mode="after")
    def _known(self) -> _Catalogue:
        unknown = set(self.fixes) - {
            MERGE_INLINE_SYSTEM, THINKING_TO_TEMPLATE, EXPLAIN_RESPONSE_STORE,
        }  # fmt: skip
        if unknown:
            raise ValueError(f"fixes the gateway has no code for: {sorted(unknown)}")
        return self


@cache
def _catalogue() -> _Catalogue:
    text = resources.files("sm120.data").joinpath(DATA_FILE).read_text("utf-8")
    return _Catalogue.model_validate(load_yaml(text))


def fix_info(name: str) -> _Fix:
    return _catalogue().fixes[name]


def fixes_for(engine: str, version: str, env: Mapping[str, str]) -> frozenset[str]:
    """The fixes a deployment of this engine build needs, given its launch environment."""
    found = set()
    for name, fix in _catalogue().fixes.items():
        if not fix.holds_for(engine, version):
            continue
        if fix.store_env is not None and env.get(fix.store_env, "0") not in ("", "0"):
            continue  # the engine keeps responses itself
        found.add(name)
    return frozenset(found)


@dataclass(frozen=True)
class Absorbed:
    body: dict[str, Any]
    changes: list[str] = field(default_factory=list)
    # A request the engine would answer with a bare error: the gateway's clearer answer.
    refusal: str | None = None


def rewrites(fixes: frozenset[str], path: str, body: Mapping[str, Any]) -> bool:
    """Whether this request to an engine with these fixes is rewritten or answered here: a
    cheap look, so the requests that need nothing keep their bytes and their path."""
    if not fixes:
        return False
    if path == MESSAGES_PATH:
        return bool(fixes & {MERGE_INLINE_SYSTEM, THINKING_TO_TEMPLATE})
    return (
        path == RESPONSES_PATH
        and EXPLAIN_RESPONSE_STORE in fixes
        and body.get("previous_response_id") is not None
    )


def absorb(body: Mapping[str, Any], path: str, fixes: frozenset[str], deployment: str) -> Absorbed:
    """The body as the engine needs it, what was changed, or the answer it should get."""
    out = copy.deepcopy(dict(body))
    changes: list[str] = []
    if path == MESSAGES_PATH:
        if MERGE_INLINE_SYSTEM in fixes:
            _merge_inline_system(out, changes)
        if THINKING_TO_TEMPLATE in fixes:
            _thinking_to_template(out, changes)
    elif path == RESPONSES_PATH and EXPLAIN_RESPONSE_STORE in fixes:
        previous = out.get("previous_response_id")
        if isinstance(previous, str) and previous:
            return Absorbed(out, changes, no_store_message(deployment, previous))
    return Absorbed(out, changes)


def no_store_message(deployment: str, response_id: str) -> str:
    store = fix_info(EXPLAIN_RESPONSE_STORE).store_env
    return (
        f"deployment {deployment}'s engine keeps no responses, so response {response_id!r} "
        f"cannot be found (vLLM keeps them only with {store}=1, which holds every response "
        "in its memory): send the whole conversation with store: false, as Codex does, or "
        f"relaunch with --set env.{store}=1"
    )


def _merge_inline_system(body: dict[str, Any], changes: list[str]) -> None:
    """System messages inside `messages` go to the end of the top-level system prompt, in
    order: where the template would render them in place (or the engine refuse them), the
    conversation's user/assistant turns and tool pairs stay as the client sent them."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    texts: list[str] = []
    kept: list[Any] = []
    for message in messages:
        text = _system_text(message)
        if text is None:
            kept.append(message)
        elif text:
            texts.append(text)
        else:
            texts.append("")  # an empty one: dropped, still counted
    if not texts:
        return
    body["messages"] = kept
    real = [text for text in texts if text]
    system = body.get("system")
    if real:
        if isinstance(system, list):
            body["system"] = [*system, *({"type": "text", "text": t} for t in real)]
        elif isinstance(system, str) and system:
            body["system"] = "\n\n".join([system, *real])
        else:
            body["system"] = "\n\n".join(real)
    changes.append(MERGED_SYSTEM.format(count=len(texts)))


def _system_text(message: Any) -> str | None:
    """The text of a system message (None: not one, or one this module does not read)."""
    if not isinstance(message, dict) or message.get("role") != "system":
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text":
            return None  # not text: the engine sees the message as the client sent it
        text = block.get("text")
        if not isinstance(text, str):
            return None
        parts.append(text)
    return "\n".join(parts)


def _thinking_to_template(body: dict[str, Any], changes: list[str]) -> None:
    """`thinking: {type: enabled|adaptive|disabled}` -> the template's own switch, unless
    the client set chat_template_kwargs itself."""
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        return
    current = body.get("chat_template_kwargs")
    if current is not None and not isinstance(current, dict):
        return
    kwargs = dict(current or {})
    names = fix_info(THINKING_TO_TEMPLATE).template_kwargs
    if any(name in kwargs for name in names):
        return
    kwargs.update({name: kind != "disabled" for name in names})
    body["chat_template_kwargs"] = kwargs
    changes.append(MAPPED_THINKING.format(kind=kind))
