"""Which KV tier backend runs on which engine build (data in sm120/data/kv_tiers.yaml)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from packaging.version import InvalidVersion, Version

from sm120.core.yaml_data import load_yaml

OK = "ok"
# An image that ships LMCache says so with the version it installs (its Dockerfile's build arg).
LMCACHE_BUILD_ARG = "LMCACHE_VERSION"


@cache
def _table() -> dict[str, Any]:
    text = resources.files("sm120.data").joinpath("kv_tiers.yaml").read_text("utf-8")
    loaded: dict[str, Any] = load_yaml(text)
    return loaded


def _release(engine_version: str) -> Version | None:
    """'0.15.1', 'v0.26.0', 'vllm 0.26.0' -> the release; a branch or fork ref -> None."""
    words = engine_version.split()
    try:
        return Version(words[-1].removeprefix("v")) if words else None
    except InvalidVersion:
        return None


def tier_refusal(
    engine: str,
    flavour: str,
    attention: str,
    backend: str,
    build_args: dict[str, str],
    engine_version: str = "",
) -> str | None:
    """Why `backend` cannot serve this engine build and attention family, or None when it can."""
    builds = _table().get(engine, {})
    if "_all" in builds:
        return str(builds["_all"])
    verdicts = builds.get(flavour)
    if verdicts is None:
        return f"unverified: no KV tier is recorded for {engine} builds of flavour '{flavour}'"
    verdict = verdicts.get(backend)
    if isinstance(verdict, str):
        return verdict
    since = (verdict or {}).get("since")
    release = _release(engine_version)
    if since is not None and release is not None and release < Version(str(since)):
        return f"{engine} {engine_version} predates the {backend} tier (vLLM {since})"
    reason = (verdict or {}).get(attention)
    if reason is None:
        return f"unverified: {backend} with {attention} attention on the {flavour} build"
    if reason != OK:
        return str(reason)
    if backend == "lmcache" and LMCACHE_BUILD_ARG not in build_args:
        return (
            f"the image does not ship the lmcache package (no image.build_args "
            f"{LMCACHE_BUILD_ARG}): build one FROM it that installs lmcache"
        )
    return None
