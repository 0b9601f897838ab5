"""A model's hooks on the board: `on_switch` after every switch, with the model, the versions and
the release in its environment; the health gate after an install's switch, whose failure, time
out or stop (the guard's) switches the board back and runs on_switch again; none: today's
install. The real agent, on local roots (`board_on`, `make_board`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support.agent_processes import wait_for
from support.agent_support import answer_json, current

from edgetune.agent.config import AgentConfig, HealthCheck, ModelHooks, load_config, write_config
from edgetune.agent.errors import AgentConfigError
from edgetune.agent.guard import ChangeStopped, SwitchGuard
from edgetune.agent.hooks import OUTPUT_LINES
from edgetune.agent.install import ChangeRecord, install_tarball, rollback
from edgetune.artifact_format.codec import from_json

# What the "application" does on a switch: note the version it now uses, and log the hook's
# environment (a line per run) for the test to read.
APP_ON_SWITCH = (
    'echo "$EDGETUNE_VERSION" > {app}/version; '
    'echo "$EDGETUNE_HOOK|$EDGETUNE_MODEL|$EDGETUNE_VERSION|$EDGETUNE_PREVIOUS_VERSION|$EDGETUNE_RELEASE|'
    '$EDGETUNE_BOARD|$PWD" >> {app}/hooks.log'
)


def with_hooks(root: Path, app: Path, health: HealthCheck | None = None, on_switch: str | None = APP_ON_SWITCH) -> Path:
    """`root`'s agent.json with hooks for mlp (as the rollout writes them); `app`: the application's folder."""
    app.mkdir(exist_ok=True)
    hooks = ModelHooks(on_switch=on_switch.format(app=app) if on_switch else None, health=health)
    write_config(root, replace(load_config(root), hooks={"mlp": hooks}))
    return root


def log_lines(app: Path) -> list[list[str]]:
    return [line.split("|") for line in (app / "hooks.log").read_text().splitlines()]


def state(root: Path) -> dict:
    return json.loads((root / "state.json").read_text())["models"]["mlp"]


def processes_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_without_hooks_an_install_is_todays(board_on, fleet):
    root = board_on(1)
    assert "hooks" not in json.loads((root / "agent.json").read_text())
    record = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert (record.result, record.to_version, record.error, record.hooks) == ("installed", 2, None, None)
    assert "hooks" not in record.to_json() and "health" not in state(root) and current(root) == "v2"


def test_on_switch_and_a_passing_health_check_run_with_the_switch_in_their_environment(board_on, fleet, tmp_path):
    app = tmp_path / "app"
    health = HealthCheck(f'{APP_ON_SWITCH.format(app=app)}; echo "serving v$EDGETUNE_VERSION"', timeout_s=30)
    root = with_hooks(board_on(1), app, health)
    record = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert (record.result, record.to_version, record.error) == ("installed", 2, None)
    v1, v2 = (str((root / "releases" / "mlp" / f"v{n}").resolve()) for n in (1, 2))
    here = str(root.resolve())
    assert log_lines(app) == [
        ["on_switch", "mlp", "2", "1", v2, "fast-1", here],
        ["health", "mlp", "2", "1", v2, "fast-1", here],
    ]
    assert [(run.hook, run.outcome, run.exit_status, run.version) for run in record.hooks] == [
        ("on_switch", "passed", 0, 2),
        ("health", "passed", 0, 2),
    ]
    assert record.hooks[1].output == "serving v2"
    health_state = state(root)["health"]
    assert (state(root)["version"], health_state["outcome"], health_state["version"], health_state["output"]) == (
        2,
        "passed",
        2,
        "serving v2",
    )
    assert from_json(ChangeRecord, json.loads(json.dumps(record.to_json()))) == record  # as the rollout decodes it

    back = rollback(root, "mlp")  # its switch runs on_switch; the health gate is an install's
    assert (back.result, back.to_version, back.error) == ("rolled_back", 1, None)
    assert log_lines(app)[2:] == [["on_switch", "mlp", "1", "2", v1, "fast-1", here]]
    assert (app / "version").read_text() == "1\n" and current(root) == "v1"
    assert state(root)["health"] == health_state  # the last health check's result stays


def test_a_failing_health_check_switches_back_and_reports_its_output(board_on, fleet, tmp_path):
    app = tmp_path / "app"
    failing = HealthCheck(
        'for i in $(seq 1 30); do echo "probe $i of v$EDGETUNE_VERSION"; done; echo "model answers NaN" >&2; exit 3', 30
    )
    root = with_hooks(board_on(1), app, failing)
    before = state(root)
    record = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert (record.result, record.from_version, record.to_version) == ("failed", 1, 2)
    assert record.error.startswith("the health check failed after the switch to v2: `for i in $(seq 1 30)")
    assert "exited 3; its output (last lines):\nprobe 12 of v2\n" in record.error and "probe 11 of" not in record.error
    assert record.error.endswith("model answers NaN; switched back to v1")
    assert [(run.hook, run.outcome, run.version) for run in record.hooks] == [
        ("on_switch", "passed", 2),
        ("health", "failed", 2),
        ("on_switch", "passed", 1),
    ]
    assert len(record.hooks[1].output.splitlines()) == OUTPUT_LINES
    # the board and the application are back on v1; the state is v1's, with the high-water mark and the result
    assert current(root) == "v1" and (app / "version").read_text() == "1\n"
    assert [line[:4] for line in log_lines(app)] == [["on_switch", "mlp", "2", "1"], ["on_switch", "mlp", "1", "2"]]
    after = state(root)
    assert {k: after[k] for k in before} == {**before, "highest_installed": 2}
    assert (after["health"]["outcome"], after["health"]["exit_status"], after["health"]["version"]) == ("failed", 3, 2)


def test_a_health_check_that_does_not_answer_in_time_is_killed_and_the_board_switches_back(board_on, fleet, tmp_path):
    app = tmp_path / "app"
    root = with_hooks(board_on(1), app, HealthCheck("echo probing; sleep 31.17 & sleep 31.17", timeout_s=1))
    started = time.monotonic()
    record = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert time.monotonic() - started < 20
    assert (record.result, current(root), (app / "version").read_text()) == ("failed", "v1", "1\n")
    assert "did not exit within 1 s (killed); its output (last lines):\nprobing; switched back to v1" in record.error
    assert record.hooks[1].outcome == "timed_out" and state(root)["health"]["outcome"] == "timed_out"
    assert processes_with("31.17") == []  # its whole process group, the background sleep too


def test_a_failing_on_switch_counts_as_a_failed_health_check(board_on, fleet, tmp_path):
    app = tmp_path / "app"
    root = with_hooks(
        board_on(1),
        app,
        on_switch=APP_ON_SWITCH + '; [ "$EDGETUNE_VERSION" != 2 ] || {{ echo "reload refused"; exit 1; }}',
    )
    record = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert (record.result, current(root), (app / "version").read_text()) == ("failed", "v1", "1\n")
    assert record.error.startswith("on_switch failed after the switch to v2: ")
    assert record.error.endswith("exited 1; its output (last lines):\nreload refused; switched back to v1")
    assert [run.outcome for run in record.hooks] == ["failed", "passed"] and "health" not in state(root)


def test_a_channel_closed_while_the_health_check_runs_switches_back_at_once(board_on, fleet, tmp_path):
    """As when the rollout that started the install goes away (or its deadline passes): the
    guard, reopened for the hooks, stops the health check and the board goes back."""
    app = tmp_path / "app"
    root = with_hooks(board_on(1), app, HealthCheck(f"touch {app}/checking; sleep 47.3", timeout_s=600))
    command = [
        sys.executable,
        "-m",
        "edgetune.agent",
        "--root",
        str(root),
        "install",
        "--model",
        "mlp",
        "--from",
        str(fleet.tarball("mlp", "gw-fast", 2)),
        "--abort-on-hangup",
        "--json",
    ]
    channel, our_end = os.pipe()
    agent = subprocess.Popen(command, stdin=channel, stdout=subprocess.PIPE, text=True)
    os.close(channel)
    try:
        wait_for(lambda: (app / "checking").exists(), "the health check to start")
        assert current(root) == "v2"
        os.close(our_end)
        output, _ = agent.communicate(timeout=20)
    finally:
        agent.kill()
    record = answer_json("install", output)
    assert (agent.returncode, record["result"]) == (1, "failed")
    assert "the SSH channel that started it closed while the hooks of the switch ran" in record["error"]
    assert record["error"].endswith("; switched back to v1")
    assert [(run["hook"], run["outcome"]) for run in record["hooks"]] == [
        ("on_switch", "passed"),
        ("health", "stopped"),
        ("on_switch", "passed"),
    ]
    assert current(root) == "v1" and (app / "version").read_text() == "1\n" and processes_with("47.3") == []


def test_the_guard_reopened_for_the_hooks_stops_them_at_its_deadline():
    with SwitchGuard(deadline_s=0.3) as guard:
        guard.commit()
        time.sleep(0.5)  # the deadline passed during the switch: the hooks are stopped at once
        with pytest.raises(ChangeStopped, match="passed while the hooks of the switch ran"):
            guard.reopen()
    started = time.monotonic()
    with pytest.raises(ChangeStopped, match="passed while the hooks"), SwitchGuard(deadline_s=0.5) as guard:
        guard.commit()
        guard.reopen()
        subprocess.run(["sleep", "30"])
    assert time.monotonic() - started < 5
    with SwitchGuard() as guard:  # no deadline, no channel: nothing stops
        guard.commit()
        guard.reopen()
        guard.commit()


@pytest.mark.parametrize(
    "hooks, problem",
    [
        (ModelHooks(on_switch=" "), "hooks.mlp.on_switch: must be a shell command"),
        (
            ModelHooks(health=HealthCheck("/opt/app/check", 0.5)),
            "hooks.mlp.health.timeout_s: must be between 1 and 3600 seconds, not 0.5",
        ),
        (ModelHooks(health=HealthCheck("", 30)), "hooks.mlp.health.command: must be a shell command"),
    ],
)
def test_bad_hooks_in_agent_json_are_refused_by_name(make_board, hooks, problem):
    root = make_board()
    with pytest.raises(AgentConfigError, match="invalid agent configuration: .*" + problem.replace(".", r"\.")):
        write_config(root, replace(load_config(root), hooks={"mlp": hooks}))


def test_agent_json_round_trips_the_hooks(make_board):
    hooks = {"mlp": ModelHooks(on_switch="systemctl reload my-app", health=HealthCheck("/opt/app/check", 30.0))}
    root = make_board(hooks=hooks)
    config = load_config(root)
    assert isinstance(config, AgentConfig) and dict(config.hooks) == hooks and config.hooks_of("other") == ModelHooks()
    assert json.loads((root / "agent.json").read_text())["hooks"] == {
        "mlp": {"on_switch": "systemctl reload my-app", "health": {"command": "/opt/app/check", "timeout_s": 30.0}}
    }
