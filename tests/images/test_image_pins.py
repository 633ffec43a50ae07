"""`sm120 build NAME --refresh-pins` against a loopback stand-in for a registry's HTTP API v2:
the token dance Docker Hub does, the manifest HEAD and its digest header, and the rewrite of
the recipe and the Dockerfile. No test here reaches a real registry."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from typer.testing import CliRunner

from sm120.images import pins
from sm120.images.pins import (
    MANIFEST_TYPES,
    PinError,
    Pinned,
    fetch_digest,
    parse_name,
    pin_dockerfile_text,
    pin_recipe_text,
    refresh_pins,
    refresh_recipe_pins,
)
from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.loader import load_recipe_file
from tests.fakes.loopback_server import LoopbackServer
from tests.helpers import REPO, invoke

DIGEST = "sha256:" + "5e" * 32
TOKEN = "pull-token"


class _Registry(BaseHTTPRequestHandler):
    """Serves one manifest behind a bearer token, as registry-1.docker.io does."""

    manifests: ClassVar[dict[str, str]] = {
        "/v2/nvidia/cuda/manifests/12.9.1-devel-ubuntu24.04": DIGEST
    }
    seen: ClassVar[list[tuple[str, str, str]]] = []

    def log_message(self, *_args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, ""))
        if (
            self.path.startswith("/token?")
            and "scope=repository%3Anvidia%2Fcuda%3Apull" in self.path
        ):
            body = b'{"token": "' + TOKEN.encode() + b'"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(404)
        self.end_headers()

    def do_HEAD(self) -> None:
        self.seen.append(("HEAD", self.path, self.headers.get("Accept", "")))
        host = self.headers["Host"]
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            challenge = f'Bearer realm="http://{host}/token",service="stand-in"'
            self.send_header("WWW-Authenticate", challenge)
            self.end_headers()
            return
        digest = self.manifests.get(self.path)
        self.send_response(200 if digest else 404)
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackServer]:
    _Registry.seen = []
    with LoopbackServer(_Registry) as server:
        monkeypatch.setenv("SM120_REGISTRY_MIRROR", server.url)
        yield server


def test_names_follow_dockers_rules() -> None:
    assert parse_name("python", "3.11-slim").repository == "library/python"
    assert parse_name("nvidia/cuda", "x").registry == "registry-1.docker.io"
    ghcr = parse_name("ghcr.io/org/img", "v1")
    assert (ghcr.registry, ghcr.repository) == ("ghcr.io", "org/img")
    assert parse_name("localhost:5000/img", "v1").registry == "localhost:5000"


def test_digest_comes_from_the_manifest_head_after_the_token(registry: LoopbackServer) -> None:
    with httpx.Client() as client:
        digest = fetch_digest(client, parse_name("nvidia/cuda", "12.9.1-devel-ubuntu24.04"))
    assert digest == DIGEST
    heads = [entry for entry in _Registry.seen if entry[0] == "HEAD"]
    assert len(heads) == 2  # refused, then with the token
    assert heads[-1][2] == MANIFEST_TYPES  # an index digest for multi-arch tags


def test_an_unknown_tag_is_one_clear_error(registry: LoopbackServer) -> None:
    with httpx.Client() as client, pytest.raises(PinError) as caught:
        fetch_digest(client, parse_name("nvidia/cuda", "no-such-tag"))
    assert caught.value.one_line() == (
        "the registry has no digest for nvidia/cuda:no-such-tag (HTTP 404) "
        "(hint: check the recipe's image name and tag)"
    )


def test_no_registry_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM120_REGISTRY_MIRROR", "http://127.0.0.1:9")
    with httpx.Client() as client, pytest.raises(PinError) as caught:
        fetch_digest(client, parse_name("nvidia/cuda", "12.9.1-devel-ubuntu24.04"))
    assert caught.value.one_line().startswith("cannot reach the registry for nvidia/cuda:")
    assert caught.value.hint == "refreshing pins needs the network (or SM120_REGISTRY_MIRROR)"


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "recipes/dsv4.yaml", root / "recipes/dsv4.yaml")
    shutil.copy(REPO / "recipes/recipe.schema.json", root / "recipes/recipe.schema.json")
    (root / "images/dsv4").mkdir(parents=True)
    shutil.copy(REPO / "images/dsv4/Dockerfile", root / "images/dsv4/Dockerfile")
    return root


def test_refresh_writes_the_digest_into_recipe_and_dockerfile(
    registry: LoopbackServer, tmp_path: Path
) -> None:
    root = _copy_tree(tmp_path)
    bases = [("nvidia/cuda", "12.9.1-devel-ubuntu24.04", "dsv4")]
    with httpx.Client() as client:
        pinned = refresh_pins(root, "dsv4", bases, client)
    assert [(p.ref, p.digest) for p in pinned] == [("nvidia/cuda:12.9.1-devel-ubuntu24.04", DIGEST)]
    recipe = load_recipe_file(root / "recipes/dsv4.yaml")
    assert recipe.image.digest == DIGEST
    # the flashinfer-decode variant builds FROM the same base: pinned too; sglang's is another
    assert recipe.variants["flashinfer-decode"].image.digest == DIGEST  # type: ignore[union-attr]
    assert recipe.variants["sglang"].image.digest is None  # type: ignore[union-attr]
    dockerfile = (root / "images/dsv4/Dockerfile").read_text()
    assert f"ARG BASE_IMAGE=nvidia/cuda:12.9.1-devel-ubuntu24.04@{DIGEST}\n" in dockerfile
    text = (root / "recipes/dsv4.yaml").read_text()
    assert text.startswith("# yaml-language-server:")  # comments and layout kept
    # refreshing again replaces the pin rather than adding a second one
    with httpx.Client() as client:
        refresh_pins(root, "dsv4", bases, client)
    assert (root / "recipes/dsv4.yaml").read_text() == text


def test_a_pinned_recipe_builds_from_the_digest(tmp_path: Path) -> None:
    text = pin_recipe_text(
        (REPO / "recipes/glm47.yaml").read_text(), "vllm/vllm-openai", "v0.16.0", DIGEST
    )
    path = tmp_path / "glm47.yaml"
    path.write_text(text)
    recipe = load_recipe_file(path)
    plan = resolve(PlanRequest(recipe="glm47"), recipe)
    assert plan.base_image_ref == f"vllm/vllm-openai:v0.16.0@{DIGEST}"
    new_digest = "sha256:" + "77" * 32
    again = pin_dockerfile_text(
        f"ARG BASE_IMAGE=vllm/vllm-openai:v0.15.1@{DIGEST}\n",
        "vllm/vllm-openai:v0.15.1",
        new_digest,
    )
    assert again == f"ARG BASE_IMAGE=vllm/vllm-openai:v0.15.1@{new_digest}\n"


def test_refresh_pins_command_reports_an_unreachable_registry(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM120_REGISTRY_MIRROR", "http://127.0.0.1:9")
    before = (REPO / "recipes/glm47.yaml").read_text()
    code, _, err = invoke(cli, "build", "glm47", "--refresh-pins")
    assert code == 2
    assert err.startswith("Error: cannot reach the registry for vllm/vllm-openai:v0.15.1: ")
    assert (REPO / "recipes/glm47.yaml").read_text() == before


def test_a_recipe_pins_each_base_it_builds_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # dsv4's default and flashinfer-decode variant share one base; sglang's and dspark's are
    # their own.
    asked: list[tuple[Path, str, list[tuple[str, str, str]]]] = []

    def record(
        root: Path, recipe: str, bases: list[tuple[str, str, str]], client: httpx.Client
    ) -> list[Pinned]:
        assert client.follow_redirects
        asked.append((root, recipe, bases))
        return [Pinned("nvidia/cuda:12.9.1-devel-ubuntu24.04", DIGEST, ("recipes/dsv4.yaml",))]

    monkeypatch.setattr(pins, "refresh_pins", record)
    pinned = refresh_recipe_pins("dsv4")
    assert pinned == [
        Pinned("nvidia/cuda:12.9.1-devel-ubuntu24.04", DIGEST, ("recipes/dsv4.yaml",))
    ]
    assert asked == [
        (
            REPO,
            "dsv4",
            [
                ("danielwoz/vllm", "dspark-nvfp4-cu132-20260708", "dspark-nvfp4"),
                (
                    "ghcr.io/local-inference-lab/vllm",
                    "karmic-kraken-beta-20260920-443d9f815c57d23b",
                    "karmic-kraken-0920",
                ),
                ("lmsysorg/sglang", "deepseek-v4-blackwell", "dsv4-sglang"),
                ("nvidia/cuda", "12.9.1-devel-ubuntu24.04", "dsv4"),
                (
                    "voipmonitor/vllm",
                    "infernal-invocation-vllm7ed814e-b12x5d648d9-fi1ac6942-cu133-torch213-20260813-r7",
                    "infernal-invocation-r7",
                ),
            ],
        )
    ]
