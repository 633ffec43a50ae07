"""What each image context carries besides its Dockerfile: the image's Python and platform,
where its engine environment comes from and how its lock is made, and where it writes caches.

Data, one `image.yaml` per context under images/, read here and nowhere else. The toolkit's
own environment is the same in every image: a venv at TOOLKIT_VENV installed from the lock
for the image's Python (images/toolkit/), so nothing it installs can touch the engine's.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sm120.core.errors import SM120Error

TOOLKIT_VENV = "/opt/sm120/venv"
TOOLKIT_PYTHON = f"{TOOLKIT_VENV}/bin/python"
# Written at build time: the engine's interpreter, resolved to an absolute path.
ENGINE_PYTHON_FILE = "/opt/sm120/engine-python"
FACTS_FILE = "image.yaml"
ENGINE_LOCK = "engine.lock"
TOOLKIT_DIR = "images/toolkit"


class FactsError(SM120Error):
    """An image context's image.yaml is missing or wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineFacts(_Strict):
    source: Literal["base", "lock", "build"] = Field(
        description="base: the base image's own environment, untouched; lock: installed from "
        "engine.lock; build: compiled in a builder stage, its dependencies from engine.lock."
    )
    python: str = Field(description="The engine's interpreter in the image (command or path).")
    module: Literal["vllm", "sglang"] = Field(description="What `import` must succeed.")
    packages: tuple[str, ...] = Field(description="Key packages `sm120 build --check` reports.")
    lock_from: Literal["resolve", "capture", "ref"] = Field(
        description="resolve: `uv pip compile` of `requirements`; capture: the installed "
        "environment of the digest-pinned base (needs Docker and the registry); ref: the "
        "requirement files of the engine ref (needs git and the network)."
    )
    requirements: tuple[str, ...] = Field((), description="What a resolved lock starts from.")
    extra_index_url: str | None = Field(None, description="An index besides PyPI (resolve).")
    exclude_newer: str | None = Field(
        None, description="Resolve as of this date: the environment the recipe was validated on."
    )
    removed: dict[str, str] = Field(
        default_factory=dict,
        description="Packages taken out after the install, each with why; left out of the "
        "lock and of `pip check`'s complaints.",
    )
    cuda: bool = Field(description="torch must be a CUDA build matching the base's CUDA.")


class ImageFacts(_Strict):
    python: str = Field(description="The image's Python, major.minor (e.g. 3.12).")
    platform: str = Field(description="uv's --python-platform for the image (e.g. linux).")
    engine: EngineFacts
    caches: dict[str, str] = Field(
        description="Where the running image writes caches worth keeping -> what writes there."
    )


@cache
def load_facts(context_dir: Path) -> ImageFacts:
    path = context_dir / FACTS_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError:
        raise FactsError(
            f"{path} does not exist", "every image context describes itself in image.yaml"
        ) from None
    try:
        return ImageFacts.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise FactsError(f"{path}: {where}: {first['msg']}", "fix image.yaml") from None


def toolkit_lock_name(python: str) -> str:
    return f"py{python}.lock"
