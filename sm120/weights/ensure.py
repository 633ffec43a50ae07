"""launch's weights step: serve from a complete checkpoint folder, fetching what is missing.

Where the weights live, in order: the plan's model dir (--model-dir, MODEL_DIR in .env or
SM120_MODEL_DIR), else sm120's own folder for the repo, SM120_HOME/models/<owner>--<name>.
A plain folder, not huggingface_hub's cache of symlinks, so it can be mounted into a
container as it is. Generated models (the tiny recipe) are built by launch itself and are
not this module's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.core.paths import sm120_home
from sm120.plan.resolve import LaunchPlan, PlanRequest
from sm120.weights.download import (
    COMMIT,
    DownloadEvents,
    hub_source,
    offline_by_environment,
    plan_download,
    run_download,
)
from sm120.weights.download_record import read_manifest
from sm120.weights.verify import WeightsReport, verify_dir

Ask = Callable[[str], bool]


class WeightsIncomplete(SM120Error):
    """The checkpoint folder cannot be served as it is."""


def managed_model_dir(repo: str) -> Path:
    return sm120_home() / "models" / repo.replace("/", "--")


def downloads_weights(plan: LaunchPlan) -> bool:
    return plan.model.generated is None and plan.model.repo is not None


def with_managed_dir(request: PlanRequest, plan: LaunchPlan) -> PlanRequest | None:
    """The request again, pointing at sm120's folder when nothing chose a model dir."""
    if plan.model_dir or not downloads_weights(plan) or plan.model.repo is None:
        return None
    return dataclasses.replace(request, model_dir=str(managed_model_dir(plan.model.repo)))


def check_local(folder: Path, repo: str | None, revision: str | None) -> WeightsReport:
    """verify_dir, plus: is it the repo and pinned commit the recipe asks for?"""
    if not folder.is_dir():
        return WeightsReport(folder, False, "none", problems=(f"{folder} does not exist",))
    report = verify_dir(folder)
    manifest = read_manifest(folder)
    extra: list[str] = []
    if manifest is not None and repo and manifest.repo != repo:
        extra.append(f"the folder holds {manifest.repo}, not {repo}")
    elif (
        manifest is not None and revision and COMMIT.match(revision) and manifest.commit != revision
    ):
        extra.append(
            f"the folder holds {manifest.repo}@{manifest.commit[:10]}; "
            f"the recipe pins {revision[:10]}"
        )
    return dataclasses.replace(report, problems=report.problems + tuple(extra))


def download_command(plan: LaunchPlan, folder: Path) -> str:
    """The command that completes `folder` for this plan, for hints."""
    parts = ["sm120 download", plan.recipe, *(f"--variant {v}" for v in plan.variants)]
    if plan.model.repo is None or folder != managed_model_dir(plan.model.repo):
        parts.append(f"--dir {folder}")
    return " ".join(parts)


def ensure_weights(plan: LaunchPlan, *, ask: Ask | None, events: DownloadEvents) -> Path | None:
    """The folder to serve from, complete; None when the plan has no weights to check.

    `ask` is put the question before anything is downloaded; None means go ahead (--yes).
    """
    if plan.model.generated is not None or plan.model_dir is None:
        return None
    folder = Path(plan.model_dir)
    model = plan.model
    report = check_local(folder, model.repo, model.revision)
    if report.ok:
        return folder
    missing = f"the weights in {folder} are incomplete: {report.summary()}"
    if model.repo is None:
        raise WeightsIncomplete(missing, "point --model-dir at a complete checkpoint")
    hint = f"run '{download_command(plan, folder)}', or launch again with --yes"
    if offline_by_environment():
        raise WeightsIncomplete(missing, f"HF_HUB_OFFLINE is set; {hint} while online")
    pinned = f"@{model.revision[:10]}" if model.revision else " (unpinned)"
    size = f" (about {model.size_gb:g} GB)" if model.size_gb else ""
    question = f"{missing}. Download {model.repo}{pinned}{size} into {folder} now?"
    if ask is not None and not ask(question):
        raise WeightsIncomplete(missing, hint)
    source = hub_source(model.repo, model.revision)
    download = plan_download(source, folder, plan.recipe, events)
    if model.revision is None:
        events.note(
            f"{plan.recipe} pins no revision of {model.repo}: "
            f"fetching {source.ref} as of commit {download.commit[:10]}"
        )
    run_download(download, events)
    report = check_local(folder, model.repo, model.revision)
    if not report.ok:
        raise WeightsIncomplete(
            f"downloaded {model.repo}, but {folder} still cannot be served: {report.summary()}",
            f"check the repo's files; 'sm120 verify {folder}' lists every problem",
        )
    return folder
