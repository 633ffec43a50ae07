"""Which keys a .env file may hold, and a one-line refusal with a did-you-mean for the rest.

A .env serves two readers: sm120's settings (KNOBS), and docker compose, which also passes
every line into the container's environment. So besides the settings it may carry compose's
own keys, credentials, and engine variables the recipe's engine build understands (the F17
allow-list); anything else is most likely a misspelling that would be silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable

from sm120.core.errors import PlanError
from sm120.core.suggest import did_you_mean
from sm120.recipe.catalogue import EnvAllowList
from sm120.recipe.knobs import KNOBS

# Read by compose.yaml only (interpolation), never by the plan.
COMPOSE_KEYS = ("IMAGE", "BIND_HOST", "MODEL_DIR")
# Passed to the engine or the hub client as they are; never printed.
CREDENTIAL_KEYS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY")


def check_dotenv_keys(keys: Iterable[str], allow: EnvAllowList, where: str = ".env") -> None:
    known = {*KNOBS, *COMPOSE_KEYS, *CREDENTIAL_KEYS}
    for key in keys:
        if key in known or allow.allows(key):
            continue
        raise PlanError(
            f"{where}: unknown key '{key}'{did_you_mean(key, sorted(known | allow.names))}",
            ".env.example lists the settings; engine variables must be ones the image's "
            "engine reads",
        )
