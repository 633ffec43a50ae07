"""Resolve a recipe into an immutable launch plan.

One resolution order, lowest first:
  recipe defaults < variants (in the order given) < .env < environment (SM120_*) < tuned
  (`sm120 tune`'s result for this host, deploy/tuned.py) < command line
then values derived from the checkpoint (index_topk_pattern) are merged in, unless the command
line already set them. Every arg and variable remembers which layer set it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sm120.core.defaults import DEFAULT_HOST, DEFAULT_PORT
from sm120.core.errors import PlanError
from sm120.core.net import check_host
from sm120.core.paths import sm120_home
from sm120.core.suggest import did_you_mean
from sm120.plan.derive import derive_index_topk_pattern, hf_overrides_with_pattern, read_config
from sm120.plan.overrides import Assignment, parse_assignment
from sm120.recipe.catalogue import coerce_flag_value, engine_flags
from sm120.recipe.knobs import KnobValues, knob_values
from sm120.recipe.loader import load_recipe
from sm120.recipe.restart_policy import parse_restart_policy, policy_text
from sm120.recipe.schema import (
    Baseline,
    Derivations,
    HardwareSpec,
    ImageSpec,
    KvTier,
    Launcher,
    ModelSource,
    MonitorSpec,
    MultiNode,
    Published,
    Recipe,
    SmokeSpec,
    Speculative,
    Timeouts,
    Variant,
)

THINKING_OFF_VARIANT = "no-think"


@dataclass(frozen=True)
class PlanRequest:
    recipe: str
    variants: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    model_dir: str | None = None
    port: int | None = None
    host: str | None = None
    served_name: str | None = None
    thinking: bool | None = None
    force: tuple[str, ...] = ()
    dotenv: Mapping[str, str] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=dict)
    # `sm120 tune`'s winning settings for this host (deploy/tuned.py), as --set texts: a
    # layer of their own, under the command line's --set, so an explicit flag still wins.
    tuned: tuple[str, ...] = ()


# Images sm120 builds are tagged sm120/<recipe>:<image-hash>: one tag per image spec, so
# `sm120 build`, .env and every compose file name the same image whatever the serve flags.
BUILT_IMAGE_PREFIX = "sm120/"


@dataclass(frozen=True)
class LaunchPlan:
    recipe: str
    title: str
    variants: tuple[str, ...]
    engine: str
    image: ImageSpec
    model: ModelSource
    model_dir: str | None
    host: str
    port: int
    args: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]
    why: Mapping[str, str]
    thinking: bool
    hardware: HardwareSpec
    baseline: Baseline | None
    timeouts: Timeouts
    smoke: SmokeSpec
    monitor: MonitorSpec
    derived: Mapping[str, Any]
    pending: tuple[str, ...]
    forced: tuple[str, ...]
    provenance: Mapping[str, str]
    plan_hash: str
    multinode: MultiNode | None = None
    published: Published | None = None  # sourced figures, shown beside the roofline
    # The chosen variant that restores a former default of the recipe (Variant.seed, else
    # Variant.former_default), if any: left out of the plan's identity.
    seed_variant: str | None = None
    kv_tier: KvTier | None = None  # rendered by render/kv_tier.py, sized by plan/fit/tier.py
    # The image's own entrypoint with its knobs (render/launcher.py), instead of an engine
    # command sm120 builds; args then state what the launcher runs, for the planner and rules.
    launcher: Launcher | None = None

    @property
    def identity_variants(self) -> tuple[str, ...]:
        """The variants that name this plan in its hash and container labels: all but the seed
        (or former-default) variant, which stands for the default as it was before a faster
        stack replaced it."""
        return tuple(name for name in self.variants if name != self.seed_variant)

    @property
    def speculative(self) -> Speculative | None:
        """The speculative decoding this plan runs (vLLM), however the recipe set it."""
        config = self.arg("speculative-config")
        if self.engine != "vllm" or not isinstance(config, dict):
            return None
        return Speculative.from_config(config)

    def arg(self, name: str, default: Any = None) -> Any:
        for key, value in self.args:
            if key == name:
                return value
        return default

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def base_image_ref(self) -> str:
        """The published image: what runs for 'pull', what the build starts FROM otherwise."""
        ref = f"{self.image.name}:{self.image.tag}"
        return f"{ref}@{self.image.digest}" if self.image.digest else ref

    @property
    def image_hash(self) -> str:
        """Identity of the image this plan runs: engine and image spec, not the serve flags."""
        return _hash({"engine": self.engine, "image": self.image.identity()})

    @property
    def image_ref(self) -> str:
        """The image a container of this plan runs."""
        if self.image.build == "dockerfile":
            return f"{BUILT_IMAGE_PREFIX}{self.recipe}:{self.image_hash}"
        return self.base_image_ref


@dataclass
class _Work:
    """The mutable state layers write into before the plan is frozen."""

    engine: str
    model: dict[str, Any]
    image: dict[str, Any]
    hardware: dict[str, Any]
    args: dict[str, Any]
    env: dict[str, str]
    why: dict[str, str]
    thinking: bool
    derive: dict[str, Any]
    baseline: Baseline | None
    published: Published | None
    smoke: dict[str, Any]
    timeouts: dict[str, Any]
    monitor: dict[str, Any]
    multinode: dict[str, Any] | None = None
    kv_tier: dict[str, Any] | None = None
    launcher: dict[str, Any] | None = None
    model_dir: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    provenance: dict[str, str] = field(default_factory=dict)

    def set_arg(self, name: str, value: Any, layer: str) -> None:
        self.args[name] = value
        self.provenance[f"args.{name}"] = layer

    def set_env(self, name: str, value: str | None, layer: str) -> None:
        if value is None:
            self.env.pop(name, None)
        else:
            self.env[name] = str(value)
        self.provenance[f"env.{name}"] = layer


def _start(recipe: Recipe) -> _Work:
    work = _Work(
        engine=recipe.engine,
        model=recipe.model.model_dump(),
        image=recipe.image.model_dump(),
        hardware=recipe.hardware.model_dump(),
        args=copy.deepcopy(dict(recipe.args)),
        env=dict(recipe.env),
        why=dict(recipe.why),
        thinking=recipe.thinking,
        derive=recipe.derive.model_dump(),
        baseline=recipe.baseline,
        published=recipe.published,
        smoke=recipe.smoke.model_dump(),
        timeouts=recipe.timeouts.model_dump(),
        monitor=recipe.monitor.model_dump(),
        port=recipe.default_port,
        multinode=recipe.multinode.model_dump() if recipe.multinode else None,
        kv_tier=recipe.kv_tier.model_dump() if recipe.kv_tier else None,
        launcher=recipe.launcher.model_dump() if recipe.launcher else None,
    )
    if recipe.speculative is not None:
        work.args["speculative-config"] = recipe.speculative.config()
    work.provenance.update({f"args.{k}": "recipe" for k in work.args})
    work.provenance.update({f"env.{k}": "recipe" for k in work.env})
    return work


def _keep_dims(work: _Work, previous: dict[str, Any]) -> None:
    """A variant's other checkpoint of the same architecture class keeps the planner's model
    dimensions (a -0731 release of DeepSeek-V4-Flash has the same layers); one of another
    architecture must bring its own. The resident size is the checkpoint's and is not kept."""
    same = previous.get("architecture") == work.model.get("architecture")
    if same and previous.get("dims") is not None:
        work.model["dims"] = previous["dims"]


def _apply_variant(work: _Work, name: str, variant: Variant) -> None:
    layer = f"variant {name}"
    previous_model = work.model
    if variant.engine:
        work.engine = variant.engine
    if variant.replace_args:
        work.args = {}
    if variant.replace_env:
        work.env = {}
    for section in ("model", "image", "hardware"):
        replacement = getattr(variant, section)
        if replacement is not None:
            setattr(work, section, replacement.model_dump())
    if variant.model is not None and variant.model.dims is None:
        _keep_dims(work, previous_model)
    for key, value in variant.args.items():
        work.set_arg(key, copy.deepcopy(value), layer)
    for key, env_value in variant.env.items():
        work.set_env(key, env_value, layer)
    work.why.update(variant.why)
    if variant.baseline is not None:
        work.baseline = variant.baseline
    if variant.published is not None:
        work.published = variant.published
    elif _changes_serving(variant):
        work.published = None  # the figures were measured on another configuration
    if variant.thinking is not None:
        work.thinking = variant.thinking
    if variant.derive is not None:
        work.derive = variant.derive.model_dump()
    if variant.smoke is not None:
        work.smoke = variant.smoke.model_dump()
    if variant.multinode is not None:
        work.multinode = variant.multinode.model_dump()
    if variant.speculative is not None:
        work.set_arg("speculative-config", variant.speculative.config(), layer)
    if variant.kv_tier is not None:
        work.kv_tier = variant.kv_tier.model_dump()
    if variant.launcher is not None:
        work.launcher = variant.launcher.model_dump()


def _changes_serving(variant: Variant) -> bool:
    return bool(
        variant.engine
        or variant.args
        or variant.model
        or variant.image
        or variant.hardware
        or variant.multinode
        or variant.replace_args
        or variant.speculative
        or variant.kv_tier
        or variant.launcher
    )


def _apply_assignment(work: _Work, assignment: Assignment, layer: str) -> None:
    path, value = assignment.path, assignment.value
    if path[0] == "args":
        work.set_arg(path[1], value, layer)
    elif path[0] == "env":
        work.set_env(path[1], None if value is None else str(value), layer)
    elif path[0] == "thinking":
        if not isinstance(value, bool):
            raise PlanError(f"--set thinking expects true or false, got {value!r}", "")
        work.thinking = value
    else:
        section: dict[str, Any] | None = getattr(work, path[0])
        if section is None and path[0] == "kv_tier":  # --set kv_tier.cpu_gib=32 turns it on
            section = work.kv_tier = {}
        if section is None:  # multinode is the other optional section
            raise PlanError(
                f"--set {assignment.text}: the plan has no multi-node layout",
                "pick a multi-node variant first (sm120 recipes show NAME lists them)",
            )
        for part in path[1:-1]:  # nested models (model.dims.block_size)
            inner = section.get(part)
            section[part] = inner = dict(inner) if isinstance(inner, dict) else {}
            section = inner
        section[path[-1]] = value
        work.provenance[".".join(path)] = layer


def _select_variants(recipe: Recipe, request: PlanRequest, layers: list[KnobValues]) -> list[str]:
    chosen = list(request.variants)
    if not chosen:
        for knobs in reversed(layers):  # environment beats .env
            if knobs.variants:
                chosen = list(knobs.variants)
                break
    thinking = request.thinking
    for knobs in reversed(layers):  # command line, then environment, then .env
        if thinking is None:
            thinking = knobs.thinking
    if thinking is False and recipe.thinking and THINKING_OFF_VARIANT not in chosen:
        if THINKING_OFF_VARIANT not in recipe.variants:
            raise PlanError(
                f"recipe '{recipe.name}' has no thinking-off variant",
                "drop ENABLE_THINKING=0 / --no-think for this recipe",
            )
        chosen.append(THINKING_OFF_VARIANT)
    for name in chosen:
        if name not in recipe.variants:
            raise PlanError(
                f"recipe '{recipe.name}' has no variant '{name}'"
                f"{did_you_mean(name, recipe.variants)}",
                f"variants: {', '.join(recipe.variants) or 'none'}",
            )
    return chosen


def _apply_knobs(work: _Work, knobs: KnobValues, layer: str) -> None:
    for text in knobs.sets:
        _apply_assignment(work, parse_assignment(text, work.engine), layer)
    if knobs.model_dir is not None:
        work.model_dir = knobs.model_dir
    if knobs.port is not None:
        work.port = knobs.port
    if knobs.host is not None:
        work.host = knobs.host
    if knobs.served_name is not None:
        work.model["served_name"] = knobs.served_name


def _validated(model: type[BaseModel], data: dict[str, Any], section: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join([section, *(str(p) for p in first["loc"])])
        raise PlanError(
            f"{where}: {str(first['msg']).removeprefix('Value error, ')}",
            "check the --set / .env value",
        ) from None


def _check_args(work: _Work) -> None:
    flags = engine_flags(work.engine)
    for name in list(work.args):
        spec = flags.spec(name)
        work.args[name] = coerce_flag_value(spec, work.args[name])
    _check_speculative(work)


def _check_launcher(work: _Work) -> None:
    """A launcher route renders only the flags its knobs carry: a flag set by hand that no
    knob carries would be silently dropped, and the launcher serves one host."""
    if work.launcher is None:
        return
    command = " ".join(work.launcher["command"])
    if work.multinode is not None or work.kv_tier is not None:
        what = "a multi-node layout" if work.multinode is not None else "a KV tier"
        raise PlanError(
            f"{what} cannot be added to a route the image's own launcher runs ({command})",
            "pick a variant whose command sm120 builds",
        )
    carried = set(work.launcher["from_args"].values())
    if any(work.derive.values()):
        raise PlanError(
            f"flags derived from the checkpoint cannot reach a launcher route ({command})",
            "turn the derivation off in the variant (derive: {index_topk_pattern: false})",
        )
    for key, layer in work.provenance.items():
        name = key.removeprefix("args.")
        if key.startswith("args.") and layer in _USER_LAYERS and name not in carried:
            raise PlanError(
                f"{name} ({layer}) is decided by the image's launcher ({command}); "
                "no knob of it carries that flag",
                "flags a knob carries: " + (", ".join(sorted(carried)) or "none"),
            )


def _check_speculative(work: _Work) -> None:
    """vLLM's --speculative-config, however it was set, must be one Speculative describes."""
    config = work.args.get("speculative-config")
    if work.engine != "vllm" or not isinstance(config, dict):
        return
    try:
        Speculative.from_config(config)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "options")
        message = str(first["msg"]).removeprefix("Value error, ")
        raise PlanError(
            f"speculative-config ({work.provenance.get('args.speculative-config', 'recipe')})"
            f"{': ' + where if where else ''}: {message}",
            'e.g. {"method": "mtp", "num_speculative_tokens": 2}',
        ) from None


def _derive(work: _Work, pending: list[str]) -> dict[str, Any]:
    if not work.derive.get("index_topk_pattern"):
        return {}
    given = work.args.get("hf-overrides")
    if isinstance(given, dict) and "index_topk_pattern" in given:
        origin = work.provenance.get("args.hf-overrides", "recipe")
        return {"index_topk_pattern": {"pattern": given["index_topk_pattern"], "source": origin}}
    config = read_config(Path(work.model_dir)) if work.model_dir else None
    if config is None:
        where = (
            f"{work.model_dir}/config.json" if work.model_dir else "the checkpoint's config.json"
        )
        pending.append(
            f"index_topk_pattern: derived at launch from {where} (indexer_types, else "
            "index_topk_freq + index_skip_topk_offset) and passed in --hf-overrides (F09)"
        )
        return {}
    derived = derive_index_topk_pattern(config)
    work.set_arg("hf-overrides", hf_overrides_with_pattern(given, derived), "derived")
    return {
        "index_topk_pattern": {
            "pattern": derived.pattern,
            "source": f"config.json {derived.source}",
            "num_hidden_layers": derived.num_hidden_layers,
            "full_layers": derived.full_layers,
            "skip_layers": derived.skip_layers,
        }
    }


# Flags a multi-node layout decides; the layer that set them last must agree with it.
_USER_LAYERS = (".env", "environment", "command line")


def layout_args(layout: MultiNode) -> dict[str, Any]:
    """The engine flags a layout stands for (None removes a flag)."""
    return {
        "tensor-parallel-size": layout.tensor_parallel,
        "pipeline-parallel-size": layout.pipeline_parallel
        if layout.pipeline_parallel > 1
        else None,
        "enable-expert-parallel": True if layout.expert_parallel > 1 else None,
        "distributed-executor-backend": "ray" if layout.executor == "ray" else "mp",
    }


def check_layout(layout: MultiNode) -> None:
    world = layout.tensor_parallel * layout.pipeline_parallel
    shape = f"TP {layout.tensor_parallel} x PP {layout.pipeline_parallel} = {world} ranks"
    if world % layout.nodes:
        raise PlanError(
            f"multinode: {shape} do not split evenly over {layout.nodes} nodes",
            "every node runs world size / nodes ranks; change tensor_parallel, "
            "pipeline_parallel or nodes",
        )
    if layout.gpus_per_node and world != layout.nodes * layout.gpus_per_node:
        raise PlanError(
            f"multinode: {shape} but {layout.nodes} nodes x {layout.gpus_per_node} GPUs = "
            f"{layout.nodes * layout.gpus_per_node} GPUs",
            "one rank per GPU: make TP x PP equal nodes x gpus_per_node",
        )
    if layout.expert_parallel not in (1, layout.tensor_parallel):
        raise PlanError(
            f"multinode: expert_parallel {layout.expert_parallel} must be 1 or equal "
            f"tensor_parallel {layout.tensor_parallel}",
            "vLLM spreads experts over the tensor-parallel ranks (--enable-expert-parallel)",
        )


def _apply_layout(work: _Work) -> None:
    if work.multinode is None:
        return
    if work.engine != "vllm":
        raise PlanError(
            f"multinode: the layout needs vLLM's distributed executor, not {work.engine}",
            "serve it on one host, or pick a vLLM variant",
        )
    layout: MultiNode = _validated(MultiNode, work.multinode, "multinode")
    check_layout(layout)
    for name, value in layout_args(layout).items():
        layer = work.provenance.get(f"args.{name}")
        if layer in _USER_LAYERS and work.args.get(name) != value:
            raise PlanError(
                f"{name}={work.args.get(name)} ({layer}) conflicts with the multi-node layout",
                "change the layout instead, e.g. --set multinode.tensor_parallel=4",
            )
        if value is None:
            work.args.pop(name, None)
            work.provenance.pop(f"args.{name}", None)
        else:
            work.set_arg(name, value, "multinode layout")


def _default_model_dir(work: _Work) -> str | None:
    if work.model.get("generated") == "tiny":
        return str(sm120_home() / "models" / "tiny")
    return None


def _hash(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def resolve(request: PlanRequest, recipe: Recipe | None = None) -> LaunchPlan:
    """Resolve `request` against the named recipe (or an already loaded one)."""
    recipe = recipe or load_recipe(request.recipe)
    layers = [
        knob_values(dict(request.dotenv), prefixed=False),
        knob_values(dict(request.environ), prefixed=True),
    ]
    variants = _select_variants(recipe, request, layers)
    work = _start(recipe)
    for name in variants:
        _apply_variant(work, name, recipe.variants[name])
    _apply_knobs(work, layers[0], ".env")
    _apply_knobs(work, layers[1], "environment")
    _apply_knobs(work, KnobValues(sets=list(request.tuned)), "tuned")
    cli = KnobValues(
        model_dir=request.model_dir,
        port=request.port,
        host=check_host(request.host) if request.host is not None else None,
        served_name=request.served_name,
        sets=list(request.sets),
    )
    _apply_knobs(work, cli, "command line")
    if work.model_dir is None:
        work.model_dir = _default_model_dir(work)
    elif work.model_dir:
        work.model_dir = str(Path(work.model_dir).expanduser().resolve())
    _apply_layout(work)
    _check_args(work)
    _check_launcher(work)
    pending: list[str] = []
    derived = _derive(work, pending)
    return _freeze(recipe, variants, work, derived, pending, request.force)


def _freeze(
    recipe: Recipe,
    variants: list[str],
    work: _Work,
    derived: dict[str, Any],
    pending: list[str],
    force: tuple[str, ...],
) -> LaunchPlan:
    model = _validated(ModelSource, work.model, "model")
    image = _validated(ImageSpec, work.image, "image")
    hardware = _validated(HardwareSpec, work.hardware, "hardware")
    smoke = _validated(SmokeSpec, work.smoke, "smoke")
    timeouts = _validated(Timeouts, work.timeouts, "timeouts")
    if "restart" in work.monitor:
        # Its own one-line error (from .env, --set or --restart), not pydantic's wording.
        work.monitor["restart"] = str(parse_restart_policy(policy_text(work.monitor["restart"])))
    monitor = _validated(MonitorSpec, work.monitor, "monitor")
    _validated(Derivations, work.derive, "derive")
    forced = tuple(sorted(set(force)))
    # A variant that restores a former default (the seed, or a later one) keeps that
    # default's identity: its name is not part of the hash or the labels.
    seed_variant = next((name for name in variants if recipe.variants[name].seed), None) or next(
        (name for name in variants if recipe.variants[name].former_default), None
    )
    identity = {
        "recipe": recipe.name,
        "variants": [name for name in variants if name != seed_variant],
        "engine": work.engine,
        "image": image.identity(),
        # planner-only facts (dims, resident size) do not change what runs
        "model": model.model_dump(exclude={"dims", "weights_gib"}),
        "model_dir": work.model_dir,
        "host": work.host,
        "port": work.port,
        "args": work.args,
        "env": work.env,
        "forced": forced,
    }
    if work.multinode is not None:  # keeps single-host plan hashes as they were
        identity["multinode"] = work.multinode
    kv_tier = _validated(KvTier, work.kv_tier, "kv_tier") if work.kv_tier is not None else None
    if kv_tier is not None:  # likewise: plans without a tier keep their hashes
        identity["kv_tier"] = kv_tier.model_dump()
    launcher = _validated(Launcher, work.launcher, "launcher") if work.launcher else None
    if launcher is not None:  # and plans that build their own command keep theirs
        identity["launcher"] = launcher.model_dump()
    return LaunchPlan(
        recipe=recipe.name,
        title=recipe.title,
        variants=tuple(variants),
        engine=work.engine,
        image=image,
        model=model,
        model_dir=work.model_dir,
        host=work.host,
        port=work.port,
        args=tuple(work.args.items()),
        env=tuple(work.env.items()),
        why=dict(work.why),
        thinking=work.thinking,
        hardware=hardware,
        baseline=work.baseline,
        timeouts=timeouts,
        smoke=smoke,
        monitor=monitor,
        derived=derived,
        pending=tuple(pending),
        forced=forced,
        provenance=dict(work.provenance),
        plan_hash=_hash(identity),
        multinode=_validated(MultiNode, work.multinode, "multinode") if work.multinode else None,
        published=work.published,
        seed_variant=seed_variant,
        kv_tier=kv_tier,
        launcher=launcher,
    )
