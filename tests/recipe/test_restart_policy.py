"""The restart policy: its words, what counts as a failure, where it is set (--restart,
.env RESTART, the recipe), what it becomes (monitor settings, Docker's own policy), and the
one-line refusal of every bad value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sm120.deploy.monitoring import prepare_cluster_monitor, settings_from_plan
from sm120.monitor.files import load_settings
from sm120.plan.resolve import PlanRequest, resolve
from sm120.recipe.restart_policy import RestartPolicy, is_failure, parse_restart_policy
from sm120.render.container import docker_restart_policy
from tests.helpers import invoke, one_line_error

WORDS_HINT = (
    "(hint: use no, on-failure, or on-failure:N for at most N restarts per window, N from 1 to 100)"
)


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("no", RestartPolicy(on_failure=False)),
        ("on-failure", RestartPolicy(on_failure=True)),
        ("on-failure:2", RestartPolicy(on_failure=True, limit=2)),
        (" on-failure:100 ", RestartPolicy(on_failure=True, limit=100)),
    ],
)
def test_policies_parse_and_print_back(text: str, policy: RestartPolicy) -> None:
    assert parse_restart_policy(text) == policy
    assert str(policy) == text.strip()


@pytest.mark.parametrize(
    ("returncode", "signum", "failed"),
    [
        (0, None, False),  # it finished
        (1, None, True),
        (137, None, True),
        (None, 9, True),  # SIGKILL: the OOM killer, kill -9
        (None, 11, True),  # SIGSEGV
        (None, 6, True),  # SIGABRT: a CUDA assert
        (None, 15, False),  # SIGTERM, SIGINT, SIGHUP: somebody asked it to stop
        (None, 2, False),
        (None, 1, False),
        (None, None, True),  # vanished without a word
    ],
)
def test_what_counts_as_a_failure(returncode: int | None, signum: int | None, failed: bool) -> None:
    assert is_failure(returncode, signum) is failed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("sometimes", f"Error: unknown restart policy 'sometimes' {WORDS_HINT}"),
        ("always", f"Error: unknown restart policy 'always' {WORDS_HINT}"),
        (
            "on-failure:x",
            f"Error: 'x' in restart policy 'on-failure:x' is not a number of restarts {WORDS_HINT}",
        ),
        ("no:3", f"Error: restart policy 'no:3' takes no count {WORDS_HINT}"),
        (
            "on-failure:0",
            "Error: restart policy 'on-failure:0' allows 0 restarts; it must be 1 to 100 "
            "(hint: use --restart no to never relaunch, else on-failure:N with N from 1 to 100)",
        ),
        (
            "on-failure:101",
            "Error: restart policy 'on-failure:101' allows 101 restarts; it must be 1 to 100 "
            "(hint: use --restart no to never relaunch, else on-failure:N with N from 1 to 100)",
        ),
    ],
)
def test_a_bad_restart_option_is_one_line(
    cli: CliRunner, isolated_home: Path, value: str, message: str
) -> None:
    code, out, err = invoke(cli, "launch", "tiny", "--restart", value)
    assert code == 2 and out == ""
    assert one_line_error(err) == message
    assert not (isolated_home / "deployments").exists()  # nothing was started or written


def test_a_bad_restart_in_dotenv_is_one_line(cli: CliRunner, isolated_home: Path) -> None:
    Path(".env").write_text("RESTART=sometimes\n")
    code, _, err = invoke(cli, "launch", "tiny", "--dry-run")
    assert code == 2
    assert one_line_error(err) == f"Error: unknown restart policy 'sometimes' {WORDS_HINT}"


def test_a_bad_restart_in_the_recipe_keys_is_one_line(cli: CliRunner, isolated_home: Path) -> None:
    code, _, err = invoke(
        cli, "launch", "tiny", "--dry-run", "--set", "monitor.restart=on-failure:x"
    )
    assert code == 2
    assert one_line_error(err) == (
        f"Error: 'x' in restart policy 'on-failure:x' is not a number of restarts {WORDS_HINT}"
    )


def test_on_failure_without_the_monitor_is_refused(cli: CliRunner, isolated_home: Path) -> None:
    code, _, err = invoke(cli, "launch", "tiny", "--restart", "on-failure", "--no-monitor")
    assert code == 2
    assert one_line_error(err) == (
        "Error: restart policy on-failure needs the monitor, which --no-monitor turns off "
        "(hint: drop --no-monitor, or launch with --restart no)"
    )


def test_on_failure_spans_nodes(cli: CliRunner, isolated_home: Path) -> None:
    nodes = ("-V", "2node", "--nodes", "node1,node2", "--restart", "on-failure:2")
    code, out, err = invoke(cli, "launch", "tiny", *nodes, "--dry-run", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["monitor"]["restart"] == "on-failure:2"
    assert [node["host"] for node in document["nodes"]] == ["node1", "node2"]
    # Without the monitor nothing would relaunch them: refused as on one host.
    code, _, err = invoke(cli, "launch", "tiny", *nodes, "--no-monitor")
    assert code == 2
    assert one_line_error(err) == (
        "Error: restart policy on-failure:2 needs the monitor, which --no-monitor turns off "
        "(hint: drop --no-monitor, or launch with --restart no)"
    )


def test_command_line_beats_dotenv_beats_recipe(isolated_home: Path) -> None:
    assert resolve(PlanRequest(recipe="tiny")).monitor.restart == "no"
    dotenv = {"RESTART": "on-failure"}
    assert resolve(PlanRequest(recipe="tiny", dotenv=dotenv)).monitor.restart == "on-failure"
    environ = {"SM120_RESTART": "on-failure:4"}
    both = PlanRequest(recipe="tiny", dotenv=dotenv, environ=environ)
    assert resolve(both).monitor.restart == "on-failure:4"
    cli = PlanRequest(recipe="tiny", dotenv=dotenv, environ=environ, sets=("monitor.restart=no",))
    assert resolve(cli).monitor.restart == "no"


def test_the_policy_reaches_the_monitor_settings_with_one_breaker(isolated_home: Path) -> None:
    plain = settings_from_plan(resolve(PlanRequest(recipe="tiny")), "native")
    assert (plain.restart_on_death, plain.restart_policy, plain.max_restarts) == (False, "no", 3)
    assert plain.restart_backoff_s == 10.0
    # on-failure alone: the recipe's max_restarts; on-failure:N: N for every restart.
    recipe_limit = resolve(PlanRequest(recipe="tiny", sets=("monitor.restart=on-failure",)))
    settings = settings_from_plan(recipe_limit, "native")
    assert (settings.restart_on_death, settings.max_restarts) == (True, 3)
    counted = resolve(
        PlanRequest(
            recipe="tiny",
            sets=("monitor.restart=on-failure:2", "monitor.restart_backoff_s=1"),
        )
    )
    settings = settings_from_plan(counted, "docker")
    assert (settings.restart_on_death, settings.restart_policy) == (True, "on-failure:2")
    assert (settings.max_restarts, settings.restart_backoff_s) == (2, 1.0)
    # Watching the server differently does not make it a different server.
    assert counted.plan_hash == resolve(PlanRequest(recipe="tiny")).plan_hash


def test_a_multi_node_monitor_keeps_the_policy(isolated_home: Path) -> None:
    plan = resolve(PlanRequest(recipe="tiny", sets=("monitor.restart=on-failure:2",)))
    files = prepare_cluster_monitor(plan, "tiny", "native")
    settings = load_settings(files.settings)
    assert (settings.restart_on_death, settings.restart_policy) == (True, "on-failure:2")
    assert settings.max_restarts == 2
    assert settings.image == f"native {plan.image.engine_version}"


def test_docker_leaves_restarts_to_the_monitor_under_on_failure() -> None:
    assert docker_restart_policy("on-failure") == {"Name": "no"}
    assert docker_restart_policy("on-failure:3") == {"Name": "no"}
    # No policy: Docker's own, as before (the container comes back with dockerd).
    assert docker_restart_policy("no") == {"Name": "unless-stopped"}


def test_the_docker_dry_run_shows_the_container_policy(cli: CliRunner, isolated_home: Path) -> None:
    for restart, docker_policy in (("on-failure:2", "no"), ("no", "unless-stopped")):
        code, out, err = invoke(
            cli,
            "launch",
            "tiny",
            "--runtime",
            "docker",
            "--dry-run",
            "--json",
            "--restart",
            restart,
        )
        assert code == 0, err
        document = json.loads(out)
        assert document["monitor"]["restart"] == restart
        assert document["container"]["restart_policy"] == {"Name": docker_policy}
