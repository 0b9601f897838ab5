"""What a pull timer installs on a board with systemd or cron (the simulated boards have
neither: tests/deploy/test_pull_timer.py runs the agent's own loop there)."""

from __future__ import annotations

import configparser
import shlex

import pytest

from edgetune.deploy.pull_timer import TimerPlan, check_period
from edgetune.errors import DeployError
from edgetune.inventory.schema import Board, SshSettings


def board(name: str = "gw-1", workdir: str = "/var/lib/edgetune") -> Board:
    return Board(name, "10.0.0.5", "gw", "host", "/usr/bin/python3", workdir, SshSettings(user="root"))


def test_systemd_units_run_the_boards_bundle_every_period_with_jitter():
    plan = TimerPlan(board(), 300)
    service, timer = configparser.ConfigParser(), configparser.ConfigParser()
    service.read_string(plan.systemd_service())
    timer.read_string(plan.systemd_timer())
    assert shlex.split(service["Service"]["ExecStart"]) == [
        "/usr/bin/python3",
        "-I",
        "/var/lib/edgetune/agent/edgetune-agent.pyz",
        "--root",
        "/var/lib/edgetune/agent",
        "sync",
        "--json",
    ]
    assert service["Service"]["Type"] == "oneshot"
    assert timer["Timer"]["OnUnitActiveSec"] == "300s" and timer["Timer"]["RandomizedDelaySec"] == "30s"
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_the_cron_line_is_in_whole_minutes_and_tagged_with_the_unit():
    plan = TimerPlan(board(), 130)
    line = plan.cron_line()
    assert line.startswith("*/2 * * * * /usr/bin/python3 -I ") and line.endswith(f"# {plan.unit}")
    assert TimerPlan(board(), 5).cron_line().startswith("*/1 ")


def test_two_boards_in_other_folders_have_their_own_units():
    assert TimerPlan(board("a", "/srv/a"), 60).unit != TimerPlan(board("b", "/srv/b"), 60).unit


@pytest.mark.parametrize("period", [0, -1, 0.5, 86401, float("nan"), True, "60"])
def test_a_period_out_of_range_is_refused(period):
    with pytest.raises(DeployError, match="--every must be a number of seconds from 1 to 86400"):
        check_period(period)
