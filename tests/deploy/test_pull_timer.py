"""Boards that were off during a rollout catch up by themselves, on the simulated fleet: with
pull timers on the gw-fast boards, a rollout while fast-1 (the class's first board, its canary)
is switched off (its link down) ends with fast-1 `pending` and fast-2, its replacement canary,
on the new version; the rollout succeeds. Once fast-1's link is back, its timer installs the
version it was assigned, and the server's record (what it reported, when) and deployed.json say
so; nobody rolls out again. A rollout by label then changes the labelled board only, and the
other's timer keeps the version assigned to it.

Uses `released_fleet` (tests/conftest.py) with a model of its own (`mlp-pull`: copies of the
built mlp) and the real server. The simulated boards have neither systemd nor crontab, so their
timer is the agent's own loop (`sync --every`)."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from support.deploy_support import publish_copy, served_on_v1
from support.sim_checks import link_down

from edgetune.artifact_format.codec import FrozenMap
from edgetune.deploy.pull_timer import install_timers, remove_timers
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.rollout import plan_rollout, rollout
from edgetune.fleet.agent_bundle import agent_root
from edgetune.fleet.process import wait_until
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.state import load_assigned, load_deployed, load_reported
from edgetune.inventory.selectors import parse_selector

MODEL = "mlp-pull"
FAST = ("fast-1", "fast-2")
PERIOD_S = 2.0


@pytest.fixture(scope="module")
def fleet(released_fleet):
    """released_fleet with MODEL, served, its v1 on the gw-fast boards, and their timers running."""
    mlp = next(m for m in released_fleet.models if m.name == "mlp")
    fleet = released_fleet.replace(models=(*released_fleet.models, dataclasses.replace(mlp, name=MODEL)))
    boards = [fleet.board(name) for name in FAST]
    with served_on_v1(fleet, MODEL, "gw-fast"):
        installed = install_timers(fleet, boards, PERIOD_S)
        try:
            assert installed.succeeded == {"fast-1": "loop", "fast-2": "loop"}, installed.failed
            yield fleet
        finally:
            removed = remove_timers(fleet, boards)
            assert removed.ok, removed.failed


def runs(fleet, name: str) -> int | None:
    with BoardSession(fleet.board(name)) as session:
        return RemoteAgent(session, fleet).status().models[MODEL].version


def reported_version(fleet, name: str) -> int | None:
    report = load_reported(fleet).get(name)
    return None if report is None else report.models.get(MODEL)


def test_the_timers_report_what_the_boards_run(fleet):
    assert wait_until(lambda: all(reported_version(fleet, name) == 1 for name in FAST), 30)
    # (other modules' rollouts share the fleet's assignments, of versions this module's store may not have)
    assert not any(MODEL in load_reported(fleet)[name].errors for name in FAST)


def test_a_board_off_during_a_rollout_is_pending_and_its_timer_installs_the_version_when_it_is_back(fleet):
    v2 = publish_copy(fleet, MODEL, "gw-fast", "v2").version
    with link_down(fleet, "fast-1"):
        result = rollout(fleet, plan_rollout(fleet, MODEL, classes=["gw-fast"], canary=1))
        records = {record["board"]: record for record in result.records()}
        assert result.ok and result.pending == ("fast-1",), records
        assert records["fast-1"]["result"] == "pending" and "not reachable at its turn" in records["fast-1"]["error"]
        assert records["fast-2"]["result"] in ("installed", "unchanged") and records["fast-2"]["runs"] == v2
        assert {name: load_assigned(fleet)[name][MODEL] for name in FAST} == {"fast-1": v2, "fast-2": v2}
        assert load_deployed(fleet)["fast-1"][MODEL] == 1  # what it was last seen running
    assert wait_until(lambda: reported_version(fleet, "fast-1") == v2, 60), load_reported(fleet).get("fast-1")
    assert runs(fleet, "fast-1") == v2
    assert load_deployed(fleet)["fast-1"][MODEL] == v2


def test_removed_timers_leave_no_process_behind(fleet):
    boards = [fleet.board(name) for name in FAST]
    pids = {}
    for board in boards:
        with BoardSession(board) as session:
            pids[board.name] = int(session.run(f"cat {agent_root(board)}/sync-loop.pid").stdout)
    assert all(_alive(pid) for pid in pids.values())
    assert remove_timers(fleet, boards).ok
    assert wait_until(lambda: not any(_alive(pid) for pid in pids.values()), 10)
    assert install_timers(fleet, boards, PERIOD_S).ok  # as the module's fixture left them, for its teardown


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # the simulated boards' processes are this machine's
    except ProcessLookupError:
        return False
    return True


def test_a_rollout_by_label_changes_the_labelled_boards_only(fleet):
    labelled = fleet.replace(
        boards=tuple(
            dataclasses.replace(b, labels=FrozenMap({"ring": "early" if b.name == "fast-2" else "late"}))
            for b in fleet.boards
        )
    )
    v3 = publish_copy(fleet, MODEL, "gw-fast", "v3").version
    result = rollout(labelled, plan_rollout(labelled, MODEL, select=parse_selector("ring=early"), canary=0))
    assert result.ok and [r["board"] for r in result.records()] == ["fast-2"], result.records()
    assert runs(fleet, "fast-2") == v3 and load_assigned(fleet)["fast-2"][MODEL] == v3
    time.sleep(3 * PERIOD_S)  # fast-1's timer runs meanwhile: it keeps the version assigned to it
    assert load_assigned(fleet)["fast-1"][MODEL] == runs(fleet, "fast-1") != v3
