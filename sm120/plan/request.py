"""The one way a command's inputs become a `PlanRequest`.

Every command that resolves a plan from what a user typed (launch, doctor, download, plan,
build, compose and each service of a compose project, recipes show) and the container
entrypoint (from the .env compose mounts) builds its request here, so all of them read the
same layers: the recipe, the variants, the .env file, the SM120_* environment and the
command line. Two commands that read different layers would resolve different plans, and so
tag different images, for the same recipe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from sm120.core.defaults import DEFAULT_ENV_FILE
from sm120.core.dotenv import read_dotenv
from sm120.plan.resolve import PlanRequest


def split_variants(values: Iterable[str]) -> tuple[str, ...]:
    """`-V a,b -V c` as (a, b, c): each option may hold several, comma-separated."""
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


def plan_request(
    recipe: str,
    *,
    environ: Mapping[str, str],
    variants: Iterable[str] = (),
    sets: Iterable[str] = (),
    model_dir: str | None = None,
    port: int | None = None,
    host: str | None = None,
    served_name: str | None = None,
    no_think: bool = False,
    force: Iterable[str] = (),
    env_file: Path | None = None,
    dotenv: Mapping[str, str] | None = None,
) -> PlanRequest:
    """The request for `recipe` as a command gives it. `environ` is handed in (the caller's
    os.environ) so that what the plan reads from the process stays visible at the call.

    The .env layer is `env_file`, else ./.env when there is one; a caller that has its
    settings already (the container entrypoint's mounted .env or environment) hands them in
    as `dotenv`, and `dotenv={}` reads none (a compose project's services, whose variants
    are their recipes' defaults)."""
    return PlanRequest(
        recipe=recipe,
        variants=split_variants(variants),
        sets=tuple(sets),
        model_dir=model_dir,
        port=port,
        host=host,
        served_name=served_name,
        thinking=False if no_think else None,
        force=tuple(force),
        dotenv=dict(dotenv) if dotenv is not None else _read_env_file(env_file),
        environ=dict(environ),
    )


def _read_env_file(env_file: Path | None) -> dict[str, str]:
    dotenv_path = env_file or (DEFAULT_ENV_FILE if DEFAULT_ENV_FILE.is_file() else None)
    return read_dotenv(dotenv_path) if dotenv_path else {}
