"""`sm120 monitor` and the monitor's part of `sm120 status`: option checks with their exact
messages, the JSON and text views, and the plot."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from sm120.engine.state import DeploymentState, save_state
from sm120.monitor.files import MonitorFiles, MonitorSettings
from sm120.monitor.peaks import JsonlRing, write_json_atomically
from tests.helpers import invoke


def deployment(home: Path, name: str = "tiny") -> MonitorFiles:
    """A deployment whose engine is long gone (its supervisor pid does not exist)."""
    files = MonitorFiles(home / "deployments" / name)
    files.make_dirs()
    save_state(
        DeploymentState(
            name=name,
            recipe="tiny",
            runtime="native",
            supervisor_pid=4_194_304,  # PID_MAX_LIMIT itself: never a live process
            engine_pid=None,
            host="127.0.0.1",
            port=1,
            plan_hash="abc",
            started_at=time.time() - 60,
            log_path=str(files.serve_log),
            exit_file=str(files.root / "exit.json"),
            served_model_name="tiny",
            model_dir=None,
            api_key_file=None,
        )
    )
    (files.root / "exit.json").write_text(
        json.dumps({"returncode": None, "signal": 9, "ended_at": time.time()})
    )
    return files


LIVE = {
    "updated": "2026-11-21T00:20:30Z",
    "updated_at": 0.0,
    "activity": "serving",
    "phase": "ready",
    "phase_detail": None,
    "running": 2.0,
    "waiting": 1.0,
    "kv_usage_pct": 6.5,
    "prefill_tps": 3900.0,
    "decode_tps": 33.0,
    "acceptance_rate": 0.753,
    "mean_acceptance_length": 2.51,
    "prefix_hit_rate": 0.8125,
    "prefix_hit_rate_total": 0.6,
    "speculative": {"method": "mtp", "num_speculative_tokens": 3},
    "peaks": {"peak_prefill_tps": 5100.0, "peak_decode_tps": 60.0, "peak_running": 3},
    "watchdog": {
        "frozen_for_s": 0.0,
        "wedge_timeout_s": 120.0,
        "restart_on_wedge": True,
        "restarts_in_window": 1,
        "max_restarts": 3,
        "window_h": 6.0,
        "gave_up": False,
    },
    "alerts": [{"at": "2026-11-21T00:20:00Z", "kind": "restart", "message": "restarting"}],
}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--plot", "out.png", "--serve"],
            "Error: --plot and --serve do not go together (hint: draw the plot with "
            "'sm120 monitor --plot OUT' while the service runs)",
        ),
        (
            ["--url", "http://127.0.0.1:8000"],
            "Error: --url and --state-dir only go with --serve (hint: add --serve)",
        ),
        (
            ["--serve", "--url", "http://127.0.0.1:8000"],
            "Error: --serve --url needs --state-dir (and --state-dir needs --url) (hint: e.g. "
            "--serve --url http://127.0.0.1:8000 --state-dir ./monitor-state)",
        ),
        (
            ["--serve", "--url", "http://127.0.0.1:8000", "--state-dir", "s", "--name", "x"],
            "Error: --name and --url do not go together (hint: --name for a deployment, --url "
            "for a server)",
        ),
        (
            ["--name", "nope"],
            "Error: no deployment named 'nope' (hint: 'sm120 status' lists them; start one "
            "with 'sm120 launch')",
        ),
        (
            ["--name", "bad/name"],
            "Error: invalid deployment name 'bad/name' (hint: use letters, digits, '.', '_' or "
            "'-', starting with a letter or digit)",
        ),
        (
            [],
            "Error: no deployment is running (hint: start one: sm120 launch tiny)",
        ),
    ],
)
def test_bad_options_fail_in_one_line(cli: CliRunner, args: list[str], message: str) -> None:
    code, out, err = invoke(cli, "monitor", *args)
    assert code == 2
    assert out == ""
    assert err.strip() == message


def test_plot_needs_an_image_file_name(cli: CliRunner, isolated_home: Path) -> None:
    deployment(isolated_home)
    code, _, err = invoke(cli, "monitor", "--plot", "out.txt")
    assert code == 2
    assert err.strip() == (
        "Error: --plot out.txt: the file name must end in .png, .svg or .pdf "
        "(hint: e.g. sm120 monitor --plot throughput.png)"
    )


def test_nothing_published_yet(cli: CliRunner, isolated_home: Path) -> None:
    deployment(isolated_home)
    code, _, err = invoke(cli, "monitor", "--json")
    assert code == 2
    assert err.strip() == (
        "Error: the monitor has published nothing for 'tiny' yet (hint: it starts with "
        "'sm120 launch'; start one by hand: sm120 monitor --serve --name tiny)"
    )


def test_json_and_text_views(cli: CliRunner, isolated_home: Path) -> None:
    files = deployment(isolated_home)
    write_json_atomically(files.live, LIVE)
    code, out, _ = invoke(cli, "monitor", "--json")
    assert code == 0 and json.loads(out) == LIVE
    code, out, _ = invoke(cli, "monitor", "--once")
    assert code == 0
    assert "SERVING" in out and "monitor NOT running" in out
    assert "3,900.0" in out and "5,100.0" in out and "60.0" in out
    assert "75.3%" in out and "75.3%  (mean length 2.51/4 mtp)" in out
    assert re.search(r"prefix cache hits\s+81\.2%  \(60\.0% since start\)", out), out
    assert "restarts 1/3 in 6 h" in out
    assert "restart: restarting" in out


def test_plot_draws_the_history(cli: CliRunner, isolated_home: Path, tmp_path: Path) -> None:
    files = deployment(isolated_home)
    ring = JsonlRing(files.history)
    for index in range(30):
        ring.append(
            {
                "t": 1.8e9 + 5 * index,
                "prefill_tps": 100.0 * index,
                "decode_tps": 30.0,
                "running": index % 3,
                "waiting": 0,
            }
        )
    out = tmp_path / "throughput.png"
    code, _, err = invoke(cli, "monitor", "--plot", str(out))
    assert code == 0, err
    assert err.strip() == f"wrote {out} (30 samples)"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_history(cli: CliRunner, isolated_home: Path, tmp_path: Path) -> None:
    deployment(isolated_home)
    code, _, err = invoke(cli, "monitor", "--plot", str(tmp_path / "t.png"))
    assert code == 2
    assert err.strip() == (
        "Error: no throughput history yet for tiny (hint: the monitor records a sample every "
        "poll once the server is up; try again later)"
    )


def test_plot_without_matplotlib(
    cli: CliRunner, isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = deployment(isolated_home)
    JsonlRing(files.history).append({"t": 1.8e9, "decode_tps": 1.0})
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    code, _, err = invoke(cli, "monitor", "--plot", str(tmp_path / "t.png"))
    assert code == 2
    assert err.strip() == (
        "Error: --plot needs matplotlib, which is not installed (hint: pip install 'sm120[plot]')"
    )


def test_status_shows_peaks_watchdog_and_the_gave_up_marker(
    cli: CliRunner, isolated_home: Path
) -> None:
    files = deployment(isolated_home)
    MonitorSettings(restart_on_wedge=True, max_restarts=2).save(files.settings)
    write_json_atomically(
        files.peak,
        {
            "peak_prefill_tps": 1400.0,
            "peak_decode_tps": 57.5,
            "peak_running": 2,
            "updated": "2026-11-21T00:00:00Z",
            "image": "img",
            "plan_hash": "abc",
        },
    )
    now = time.time()
    write_json_atomically(
        files.watchdog,
        {
            "restarts": [now - 60, now - 30],
            "gave_up_at": 1_795_000_000.0,
            "gave_up_reason": "2 watchdog restarts in the last 6 h (limit 2)",
        },
    )
    code, out, _ = invoke(cli, "status")
    assert code == 0
    assert "  monitor   not running" in out
    assert "  peaks     prefill 1,400.0 tok/s, decode 57.5 tok/s, 2 running" in out
    assert "  watchdog  restarts on wedge, 2/2 restarts in 6 h, wedge after 120 s" in out
    assert (
        "  GAVE UP   at 2026-11-18T11:06:40Z: 2 watchdog restarts in the last 6 h (limit 2)" in out
    )
    code, out, _ = invoke(cli, "status", "--json")
    watchdog = json.loads(out)[0]["monitor"]["watchdog"]
    assert watchdog["gave_up"] is True and watchdog["restarts_in_window"] == 2


GPUS = [
    {
        "index": 0,
        "util_pct": 100.0,
        "power_w": 540.5,
        "power_limit_w": 600.0,
        "memory_used_mib": 90000.0,
        "memory_total_mib": 97887.0,
        "temperature_c": 83.0,
    },
    {
        "index": 1,
        "util_pct": 0.0,
        "power_w": 61.0,
        "power_limit_w": 600.0,
        "memory_used_mib": 90000.0,
        "memory_total_mib": 97887.0,
        "temperature_c": 41.0,
    },
]


def test_status_json_and_text_show_each_gpu(cli: CliRunner, isolated_home: Path) -> None:
    files = deployment(isolated_home)
    write_json_atomically(files.live, {**LIVE, "updated_at": time.time(), "gpus": GPUS})
    code, out, _ = invoke(cli, "status", "--json")
    assert code == 0
    gpus = json.loads(out)[0]["gpus"]
    assert [sorted(gpu) for gpu in gpus] == [
        [
            "index",
            "memory_total_mib",
            "memory_used_mib",
            "power_limit_w",
            "power_w",
            "temperature_c",
            "util_pct",
        ]
    ] * 2
    assert [(g["index"], g["util_pct"], g["power_w"], g["temperature_c"]) for g in gpus] == [
        (0, 100.0, 540.5, 83.0),
        (1, 0.0, 61.0, 41.0),
    ]
    code, out, _ = invoke(cli, "status")
    assert "  GPU0      100% util, 540/600 W, 83 C, 90000/97887 MiB" in out
    assert "  GPU1      0% util, 61/600 W, 41 C, 90000/97887 MiB" in out


def test_status_json_has_no_gpus_from_a_stale_monitor(cli: CliRunner, isolated_home: Path) -> None:
    files = deployment(isolated_home)
    write_json_atomically(files.live, {**LIVE, "gpus": GPUS})  # updated_at 0: long stale
    code, out, _ = invoke(cli, "status", "--json")
    assert code == 0 and json.loads(out)[0]["gpus"] == []


def test_the_live_view_shows_each_gpu(cli: CliRunner, isolated_home: Path) -> None:
    files = deployment(isolated_home)
    write_json_atomically(files.live, {**LIVE, "activity": "livelock", "gpus": GPUS})
    code, out, _ = invoke(cli, "monitor", "--once")
    assert code == 0
    assert "LIVELOCK" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert rows == [
        ["0", "100%", "540", "W", "/", "600", "W", "90,000", "/", "97,887", "MiB", "83", "C"],
        ["1", "0%", "61", "W", "/", "600", "W", "90,000", "/", "97,887", "MiB", "41", "C"],
    ]


def test_plot_draws_gpu_power_beside_throughput(
    cli: CliRunner, isolated_home: Path, tmp_path: Path
) -> None:
    files = deployment(isolated_home)
    ring = JsonlRing(files.history)
    for index in range(40):
        spinning = index >= 20  # tokens stop, the GPUs keep burning power
        gpus = [
            {**GPUS[0], "power_w": 540.0 if spinning else 300.0 + index, "util_pct": 100.0},
            {**GPUS[1], "power_w": 61.0, "util_pct": 0.0 if spinning else 60.0},
        ]
        ring.append(
            {
                "t": 1.8e9 + 5 * index,
                "prefill_tps": 0.0,
                "decode_tps": 0.0 if spinning else 40.0,
                "running": 1,
                "waiting": 0,
                "gpus": gpus,
            }
        )
    out = tmp_path / "gpus.png"
    code, _, err = invoke(cli, "monitor", "--plot", str(out))
    assert code == 0, err
    assert err.strip() == f"wrote {out} (40 samples)"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out) as image:
        # Three panels (rates, queue, GPUs) at 3 inches each, 100 dpi.
        assert image.size == (1000, 900)


def test_serve_by_hand_refuses_a_damaged_cluster_start(cli: CliRunner, isolated_home: Path) -> None:
    # By hand as from launch, a deployment over several nodes gets its relaunch: a start
    # file it cannot read stops it before it watches without one.
    files = deployment(isolated_home)
    broken = files.own / "cluster_start.json"
    broken.write_text("{")
    code, _, err = invoke(cli, "monitor", "--serve", "--name", "tiny")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"Error: {broken} is unusable: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1) (hint: launch tiny again to write it anew)"
    )
