"""sm120.compose.write.write_compose without the command line: which form a request takes,
the refusals that keep one recipe's options off a project, what it hands back for the CLI to
print, and the one-line error for a file it cannot write."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sm120.compose.members import ComposeError
from sm120.compose.request import ComposeRequest
from sm120.compose.write import Composed, image_caches, write_compose
from sm120.plan.resolve import PlanRequest, resolve

ONE_RECIPE_ONLY = (
    "--variant, --model-dir and --port apply to one recipe, not a project "
    "(hint: with several recipes use --ports NAME=PORT; their variants are the defaults)"
)


@pytest.mark.parametrize(
    ("request_", "project"),
    [
        (ComposeRequest(("tiny",)), False),
        (ComposeRequest(("tiny",), variants=("x",), port=8100, model_dir="/m"), False),
        (ComposeRequest(("tiny", "glm52")), True),
        (ComposeRequest(("fast=tiny",)), True),
        (ComposeRequest(("tiny",), ports=("tiny=8001",)), True),
        (ComposeRequest(("tiny",), gpus=("tiny=0",)), True),
        (ComposeRequest(("tiny",), host_network=True), True),
    ],
)
def test_which_requests_are_projects(request_: ComposeRequest, project: bool) -> None:
    assert request_.is_project is project


@pytest.mark.parametrize(
    "one_recipe_option",
    [{"port": 8100}, {"variants": ("seed",)}, {"model_dir": "/models/tiny"}],
    ids=["port", "variant", "model-dir"],
)
def test_one_recipe_options_are_refused_for_a_project(
    one_recipe_option: dict[str, object], tmp_path: Path
) -> None:
    output = tmp_path / "compose.yaml"
    request = replace(ComposeRequest(("tiny", "fast=tiny"), output=output), **one_recipe_option)
    with pytest.raises(ComposeError) as refused:
        write_compose(request)
    assert refused.value.one_line() == ONE_RECIPE_ONLY
    assert list(tmp_path.iterdir()) == []


def test_port_zero_is_still_a_port_for_the_rule(tmp_path: Path) -> None:
    # `port is not None`, not truthiness: --port 0 on a project is refused by this rule too.
    request = ComposeRequest(("tiny", "fast=tiny"), output=tmp_path / "c.yaml", port=0)
    with pytest.raises(ComposeError, match="apply to one recipe, not a project"):
        write_compose(request)


def test_a_project_needs_an_output_file() -> None:
    with pytest.raises(ComposeError) as refused:
        write_compose(ComposeRequest(("tiny", "fast=tiny"), ports=("fast=8001",)))
    assert refused.value.one_line() == (
        "a compose project is written with its key files beside it, not to stdout "
        "(hint: pass -o FOLDER/compose.yaml)"
    )


def test_one_recipe_without_output_comes_back_as_text(tmp_path: Path) -> None:
    composed = write_compose(ComposeRequest(("tiny",), port=8100))
    assert composed == Composed(text=composed.text)
    assert composed.text is not None
    assert yaml.safe_load(composed.text)["services"]["server"]["ports"] == ["127.0.0.1:8100:8100"]
    assert composed.notes() == []
    assert list(tmp_path.iterdir()) == []


def test_one_recipe_to_a_file(tmp_path: Path) -> None:
    output = tmp_path / "out.yaml"
    composed = write_compose(ComposeRequest(("tiny",), output=output))
    assert composed == Composed(output=output, written=(output,))
    assert composed.notes() == [f"wrote {output} (docker compose -f {output} up)"]
    assert output.read_text() == write_compose(ComposeRequest(("tiny",))).text


def test_a_file_that_cannot_be_written_is_one_line_with_a_hint(tmp_path: Path) -> None:
    output = tmp_path / "missing" / "compose.yaml"
    with pytest.raises(ComposeError) as refused:
        write_compose(ComposeRequest(("tiny",), output=output))
    assert refused.value.one_line() == (
        f"cannot write {output}: No such file or directory "
        "(hint: pass -o a file in a folder that exists and is writable, or leave -o out)"
    )


def test_a_project_names_its_files_and_its_gateway(tmp_path: Path) -> None:
    output = tmp_path / "compose.yaml"
    request = ComposeRequest(
        ("tiny", "fast=tiny"), output=output, ports=("fast=8001",), gateway_port=9000
    )
    composed = write_compose(request)
    secrets = tmp_path / "secrets"
    assert composed == Composed(
        output=output,
        written=(
            output,
            tmp_path / "gateway-backends.json",
            secrets / "gateway_key",
            secrets / "tiny_key",
            secrets / "fast_key",
        ),
        gateway_url="http://127.0.0.1:9000/v1",
    )
    assert all(path.is_file() for path in composed.written)
    assert composed.notes() == [
        *(f"wrote {path}" for path in composed.written),
        f"gateway on http://127.0.0.1:9000/v1 (its key: {tmp_path}/secrets/gateway_key); "
        f"docker compose -f {output} up",
    ]


def test_a_project_of_published_images_has_no_image_for_its_gateway(tmp_path: Path) -> None:
    # tiny's gpu variant (chosen in the environment) runs a published vLLM image, without sm120.
    request = ComposeRequest(
        ("tiny", "fast=tiny"),
        output=tmp_path / "compose.yaml",
        ports=("fast=8001",),
        gpus=("tiny=0", "fast=1"),
        environ={"SM120_VARIANT": "gpu"},
    )
    with pytest.raises(ComposeError) as refused:
        write_compose(request)
    assert refused.value.one_line() == (
        "no recipe here runs an image sm120 builds, so the gateway has none to run in "
        "(hint: add a recipe whose image is built with 'sm120 build' (they carry sm120))"
    )
    assert list(tmp_path.iterdir()) == []


def test_image_caches_come_from_a_built_image_only() -> None:
    built = resolve(PlanRequest(recipe="glm52"))
    assert built.image.build == "dockerfile"
    assert image_caches(built)  # glm52's image.yaml names where it writes caches
    published = replace(built, image=built.image.model_copy(update={"build": "pull"}))
    assert image_caches(published) == {}
