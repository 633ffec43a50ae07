"""Plan + hardware + rules in one call: what `launch --dry-run`, `launch` and the container
entrypoint all do before anything starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sm120.core.errors import PlanError, RuleViolation
from sm120.core.net import http_url
from sm120.core.suggest import did_you_mean
from sm120.doctor.detect import detect
from sm120.plan.fit.roofline import roofline_or_reason, speculative_roofline
from sm120.plan.hardware import Hardware, assumed
from sm120.plan.resolve import LaunchPlan, PlanRequest, resolve
from sm120.plan.rules import RuleResult, evaluate, failures, rule_ids
from sm120.plan.ward import ward_route
from sm120.recipe.endpoints import engine_protocols, protocol_paths
from sm120.recipe.schema import Published
from sm120.render.argv import render_argv
from sm120.render.environment import render_env


@dataclass(frozen=True)
class CheckedPlan:
    plan: LaunchPlan
    hardware: Hardware
    results: list[RuleResult]

    @property
    def failed(self) -> list[RuleResult]:
        return failures(self.results)

    def raise_on_failure(self) -> None:
        failed = self.failed
        if failed:
            first = failed[0]
            more = f" (+{len(failed) - 1} more rule failures)" if len(failed) > 1 else ""
            raise RuleViolation(
                f"[{first.id}] {first.messages[0]}{more}",
                f"fix the setting, or skip the rule with --force {first.id}",
            )


def check_force_ids(force: tuple[str, ...]) -> None:
    known = rule_ids()
    for rule_id in force:
        if rule_id not in known:
            raise PlanError(
                f"--force: unknown rule '{rule_id}'{did_you_mean(rule_id, known)}",
                "rule ids are listed by 'sm120 launch NAME --dry-run'",
            )


def checked_plan(request: PlanRequest, hardware: Hardware | None = None) -> CheckedPlan:
    check_force_ids(request.force)
    plan = resolve(request)
    if hardware is None and plan.multinode is not None:
        hardware = assumed(plan.hardware)  # each node is checked by the per-node preflight
    hw = hardware or detect() or assumed(plan.hardware)
    return CheckedPlan(plan, hw, evaluate(plan, hw))


def protocols_document(engine: str, version: str) -> dict[str, Any]:
    """What a coding agent can speak to this engine build (sm120/data/endpoints.yaml)."""
    known = engine_protocols(engine, version)
    paths = protocol_paths()
    return {
        "serves": [paths[name] for name in paths if name in known.serves],
        "lacks": [paths[name] for name in paths if name in known.lacks],
        "source": known.source,
    }


def plan_document(checked: CheckedPlan) -> dict[str, Any]:
    """The `--json` form of a plan: stable keys scripts can rely on."""
    plan = checked.plan
    document = {
        "recipe": plan.recipe,
        "variant": ",".join(plan.variants) or None,
        "variants": list(plan.variants),
        "title": plan.title,
        "engine": plan.engine,
        "image": plan.image_ref,
        "image_build": plan.image.build,
        # the immutable reference of the engine image: its digest, else its engine commit
        "image_pin": plan.image.pin,
        "model": {
            "repo": plan.model.repo,
            "revision": plan.model.revision,
            "served_name": plan.model.served_name,
            "dir": plan.model_dir,
            # "tiny": random weights built locally; gates then check the serving path only
            "generated": plan.model.generated,
        },
        "endpoint": http_url(plan.host, plan.port, "/v1"),
        "protocols": protocols_document(plan.engine, plan.image.engine_version),
        # unix socket: the engine listens there only, sm120's ward holds the port
        # (sm120.plan.ward); open: the engine's own routes answer on the port
        "ward": dataclasses.asdict(ward_route(plan)),
        "argv": render_argv(plan),
        "env": render_env(plan),
        "plan_hash": plan.plan_hash,
        "thinking": plan.thinking,
        "derived": dict(plan.derived),
        "pending": list(plan.pending),
        "forced": list(plan.forced),
        "hardware": {
            "target": plan.hardware.model_dump(),
            "checked_against": {
                "gpus": checked.hardware.gpus,
                "arch": checked.hardware.arch,
                "source": checked.hardware.source,
            },
        },
        "rules": [r.as_dict() for r in checked.results],
        "ok": not checked.failed,
        "provenance": dict(plan.provenance),
        "why": dict(plan.why),
        "baseline": plan.baseline.model_dump(exclude_none=True) if plan.baseline else None,
        "timeouts": plan.timeouts.model_dump(),
        "monitor": plan.monitor.model_dump(),
    }
    if plan.multinode is not None:
        document["multinode"] = plan.multinode.model_dump()
    if plan.kv_tier is not None:  # rendered into argv / env above; here as the recipe said it
        document["kv_tier"] = plan.kv_tier.model_dump()
    document.update(performance_document(plan))
    return document


def performance_document(plan: LaunchPlan) -> dict[str, Any]:
    """Published figures and the decode roofline side by side (`published` is null when no
    figure with an openable source exists for this configuration)."""
    roofline, reason = roofline_or_reason(plan)
    spec = speculative_roofline(plan, roofline) if roofline else None
    bound = spec.tok_s if spec else (roofline.tok_s if roofline else None)
    published = published_document(plan.published)
    return {
        "published": published,
        "roofline_decode_tok_s": round(roofline.tok_s, 1) if roofline else None,
        "roofline": roofline.as_dict() if roofline else {"unknown": reason},
        "roofline_spec_decode_tok_s": round(spec.tok_s, 1) if spec else None,
        "roofline_spec": spec.as_dict() if spec else None,
        # A figure above the roofline it can reach (speculative when the plan speculates)
        # is faster than the hardware allows at that acceptance: suspect, not a target.
        "published_suspect": bool(published and bound and published["decode_tok_s"] > bound),
        "speculative": plan.speculative.model_dump() if plan.speculative else None,
    }


def published_document(published: Published | None) -> dict[str, Any] | None:
    if published is None:
        return None
    decode = published.decode
    return {
        "decode_tok_s": decode.tok_s,
        "prefill_tok_s": published.prefill.tok_s if published.prefill else None,
        "throughput_tok_s": published.throughput.tok_s if published.throughput else None,
        "throughput_concurrency": (
            published.throughput.concurrency if published.throughput else None
        ),
        "source": decode.source,
        "hardware": decode.hardware,
        "date": decode.date,
        "engine_ref": decode.engine_ref,
        "figures": published.model_dump(exclude_none=True),
    }
