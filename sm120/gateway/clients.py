"""What `sm120 connect` knows of each coding agent (sm120/data/agent_clients.yaml): the size of
its own prompt, so a deployment too small for it is refused before the client finds out, and
the bound on its retries."""

from __future__ import annotations

from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from sm120.core.yaml_data import load_yaml

DATA_FILE = "agent_clients.yaml"


class AgentClient(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    prompt_tokens: int = Field(gt=0)
    reply_tokens: int = Field(gt=0)
    max_retries: int = Field(ge=0)
    source: str

    @property
    def needs_tokens(self) -> int:
        """The smallest context that holds the client's own prompt and one answer."""
        return self.prompt_tokens + self.reply_tokens


class _Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    clients: dict[str, AgentClient]


@cache
def _catalogue() -> _Catalogue:
    text = resources.files("sm120.data").joinpath(DATA_FILE).read_text("utf-8")
    return _Catalogue.model_validate(load_yaml(text))


def agent_client(name: str) -> AgentClient | None:
    return _catalogue().clients.get(name)
