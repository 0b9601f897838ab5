"""A rollout that never lies, on the simulated fleet: whatever happens to a board mid-rollout
(a reference check outliving the timeout, the SSH connection cut, a rollback that fails, a
pinned downgrade), the rollout reports what the board really runs, and deployed.json (what
`fleet status` shows) agrees with every board.

Uses `released_fleet` (tests/conftest.py), its gw-fast boards and the real server; the releases
rolled out here are of a model of their own (`mlp-truth`: copies of the built mlp, some with a
library that sleeps when loaded). The boards' directories and the store are this module's own;
within the module, the tests run in order, each starting from the state the one before left.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from support.agent_processes import check_processes, wait_for
from support.deploy_support import publish_copy, publish_version, served_on_v1, sleeping_library
from support.sim_checks import link_down

from edgetune.artifact.store import ArtifactStore
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.rollout import plan_rollout, rollout
from edgetune.fleet.agent_bundle import agent_root
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.state import load_deployed

MODEL = "mlp-truth"
BOARDS = ("fast-1", "fast-2", "slow-1", "slow-2")
FAST = ["gw-fast"]


@pytest.fixture(scope="module")
def sleeping(tmp_path_factory) -> bytes:
    return sleeping_library(tmp_path_factory.mktemp("sleeping"))


@pytest.fixture(scope="module")
def fleet(released_fleet):
    """released_fleet with MODEL declared, served, and v1 of it installed on the gw-fast boards."""
    mlp = next(m for m in released_fleet.models if m.name == "mlp")
    fleet = released_fleet.replace(models=(*released_fleet.models, dataclasses.replace(mlp, name=MODEL)))
    with served_on_v1(fleet, MODEL, "gw-fast"):
        yield fleet


def status(fleet, name: str) -> dict:
    with BoardSession(fleet.board(name)) as session:
        return RemoteAgent(session, fleet).call("status")["models"].get(MODEL, {})


def assert_deployed_json_is_every_board(fleet) -> None:
    """What `fleet status` shows of MODEL is what each gw-fast board says it runs; the gw-slow
    boards, never targeted here, have no record of it."""
    deployed = load_deployed(fleet)
    running = {name: status(fleet, name).get("version") for name in ("fast-1", "fast-2")}
    assert {name: deployed.get(name, {}).get(MODEL) for name in BOARDS} == {**running, "slow-1": None, "slow-2": None}


def by_board(result) -> dict[str, dict]:
    return {record["board"]: record for record in result.records()}


def checking(fleet, name: str) -> list[int]:
    """The reference checks the agent of board `name` runs now."""
    return check_processes(agent_root(fleet.board(name)))


def test_every_targeted_class_has_its_own_canary_stage(deploy_fleet):
    """Pure planning on the loopback fleet: fast-1, fast-2 (gw-fast), slow-1 (gw-slow)."""
    for device_class in ("gw-fast", "gw-slow"):
        publish_version(deploy_fleet, "mlp", device_class, device_class.encode())

    def stages(**settings) -> list[tuple[str, list[str]]]:
        return [
            (s.name, [t.board.name for t in s.targets]) for s in plan_rollout(deploy_fleet, "mlp", **settings).stages
        ]

    assert stages() == [("canary gw-fast", ["fast-1"]), ("canary gw-slow", ["slow-1"]), ("batch 1", ["fast-2"])]
    assert stages(canary=2) == [("canary gw-fast", ["fast-1", "fast-2"]), ("canary gw-slow", ["slow-1"])]
    assert stages(classes=["gw-slow"]) == [("canary gw-slow", ["slow-1"])]
    assert stages(canary=0, batch=2) == [("batch 1", ["fast-1", "fast-2"]), ("batch 2", ["slow-1"])]
    assert plan_rollout(deploy_fleet, "mlp").agent_deadline_s == 270  # 30 s before the rollout's 300 s
    assert plan_rollout(deploy_fleet, "mlp", timeout_s=8).agent_deadline_s == 6  # a quarter of a short one


def test_a_canary_whose_check_outlives_the_timeout_leaves_deployed_json_matching_every_board(fleet, sleeping):
    """The agent's deadline (6 s) stops the check before the rollout's timeout (8 s) ends; should
    its answer come late all the same (a loaded host), fast-1 is read back: failed on v1 either way."""
    publish_copy(fleet, MODEL, "gw-fast", "v2-sleeps", library=sleeping)  # its check would take 90 s
    started = time.monotonic()
    result = rollout(fleet, plan_rollout(fleet, MODEL, classes=FAST, timeout_s=8))
    assert time.monotonic() - started < 60
    records = by_board(result)
    assert not result.ok and "canary gw-fast" in result.stopped
    assert (records["fast-1"]["result"], records["fast-1"]["from_version"], records["fast-1"]["runs"]) == (
        "failed",
        1,
        1,
    )
    assert "deadline" in records["fast-1"]["error"] or "read back: it runs v1" in records["fast-1"]["error"]
    assert (records["fast-2"]["result"], records["fast-2"]["runs"]) == ("skipped", 1)
    wait_for(lambda: not checking(fleet, "fast-1"), "the canary's check to be stopped", timeout_s=15)
    assert status(fleet, "fast-1")["version"] == 1  # no orphan switched it behind the rollout's back
    assert_deployed_json_is_every_board(fleet)


def test_a_channel_dropped_mid_install_leaves_the_board_on_its_release_and_is_read_back(fleet, caplog):
    """The newest gw-fast version still sleeps in its check; while it does, the SSH connection
    that started the canary's agent is killed (its sshd session process on the board)."""
    caplog.set_level(logging.INFO, logger="edgetune.deploy.rollout")
    plan = plan_rollout(fleet, MODEL, classes=FAST, timeout_s=120)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", rollout(fleet, plan)))
    thread.start()
    try:
        wait_for(lambda: checking(fleet, "fast-1"), "the canary's reference check to start")
        cut = time.monotonic()
        os.kill(_ssh_session_of(checking(fleet, "fast-1")[0]), signal.SIGKILL)
        wait_for(lambda: not checking(fleet, "fast-1"), "the agent to stop its check", timeout_s=20)
        assert time.monotonic() - cut < 20  # it noticed the channel, well before its 90 s deadline
    finally:
        thread.join(timeout=120)
    result = outcome["result"]
    fast_1 = by_board(result)["fast-1"]
    assert (fast_1["result"], fast_1["runs"]) == ("failed", 1) and "read back: it runs v1" in fast_1["error"]
    lines = [r.getMessage() for r in caplog.records if r.name == "edgetune.deploy.rollout"]
    unknown = next(i for i, line in enumerate(lines) if line.startswith("  fast-1: unknown ("))
    assert lines[unknown + 1] == "  fast-1: read back: it runs v1"
    assert_deployed_json_is_every_board(fleet)


def _ssh_session_of(pid: int) -> int:
    """The sshd process (on the board) serving the connection that `pid` descends from."""
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name.startswith("sshd"):
            return pid
        pid = int(fields[1])
    raise AssertionError("no sshd above the agent")


@pytest.fixture
def fast_2_disk_full(fleet):
    """fast-2's downloads on a tiny tmpfs mounted on the board: a real 'no space left on device'."""
    downloads = f"{agent_root(fleet.board('fast-2'))}/downloads"
    with BoardSession(fleet.board("fast-2")) as board:
        board.run(f"mkdir -p {downloads} && mount -t tmpfs -o size=8k edgetune-test-full {downloads}")
        try:
            yield
        finally:
            board.run(f"umount {downloads}")


def test_a_rollback_that_fails_is_reported_as_rollback_failed(fleet, fast_2_disk_full):
    """fast-1 (canary) installs v3, fast-2 fails (its disk is full), so fast-1 is rolled back, but
    its kept v1 was damaged on its disk meanwhile: the rollback is refused and reported as such."""
    v3 = publish_copy(fleet, MODEL, "gw-fast", "v3")
    library = Path(agent_root(fleet.board("fast-1"))) / "releases" / MODEL / "v1" / "model.so"
    good = library.read_bytes()
    library.write_bytes(good[:-64] + bytes(64))
    try:
        result = rollout(fleet, plan_rollout(fleet, MODEL, classes=FAST))
    finally:
        library.write_bytes(good)
    records = by_board(result)
    assert "failed or were lost" in result.stopped
    assert (records["fast-2"]["result"], records["fast-2"]["runs"]) == ("failed", 1)
    fast_1 = records["fast-1"]
    assert (fast_1["result"], fast_1["from_version"], fast_1["to_version"], fast_1["runs"]) == (
        "rollback_failed",
        1,
        v3.version,
        v3.version,
    )
    assert "rolling back to v1 failed" in fast_1["error"] and "--version 1" in fast_1["error"]
    assert_deployed_json_is_every_board(fleet)


def test_a_pin_below_the_newest_installed_is_rolled_out_as_a_logged_downgrade(fleet, caplog):
    """fast-1 runs v3 (the rollback above failed), fast-2 v1; fast-1 is pinned to v1."""
    newest = ArtifactStore(fleet.artifacts.dir).latest(MODEL, "gw-fast").version
    pinned = fleet.replace(
        boards=tuple(dataclasses.replace(b, pin={MODEL: 1}) if b.name == "fast-1" else b for b in fleet.boards)
    )
    with caplog.at_level(logging.WARNING, logger="edgetune.deploy.rollout"):
        result = rollout(pinned, plan_rollout(pinned, MODEL, classes=FAST, canary=0))
    records = by_board(result)
    assert result.ok, result.records()
    assert [
        (r["result"], r["from_version"], r["to_version"], r["downgrade"], r["runs"])
        for r in (records["fast-1"], records["fast-2"])
    ] == [("installed", newest, 1, True, 1), ("installed", 1, newest, False, newest)]
    warnings = [r.getMessage() for r in caplog.records if "downgrade" in r.getMessage()]
    assert warnings == [
        f"fast-1: v1 of {MODEL} is below v{newest}, the newest it has installed: a deliberate downgrade (the inventory's pin)"
    ]
    assert_deployed_json_is_every_board(fleet)


def test_a_board_cut_off_mid_install_stays_unknown_in_the_result_and_the_record(fleet, sleeping):
    """fast-1 (canary) checks a release whose library sleeps; its network goes down meanwhile: the
    install's answer never comes and fast-1 cannot be read back. Once it is back, it runs what it
    ran: its agent stopped at its deadline."""
    publish_copy(fleet, MODEL, "gw-fast", "v4-sleeps", library=sleeping)
    plan = plan_rollout(fleet, MODEL, classes=FAST, timeout_s=6)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", rollout(fleet, plan)))
    thread.start()
    try:
        wait_for(lambda: checking(fleet, "fast-1"), "the canary's reference check to start")
        with link_down(fleet, "fast-1"):
            thread.join(timeout=120)
    finally:
        thread.join(timeout=120)
    records = by_board(outcome["result"])
    assert (records["fast-1"]["result"], records["fast-1"]["runs"]) == ("unknown", "unknown")
    assert "could not be read back" in records["fast-1"]["error"]
    assert (
        load_deployed(fleet)["fast-1"][MODEL] == "unknown"
        and load_deployed(fleet)["fast-2"][MODEL] == records["fast-2"]["runs"]
    )
    assert not checking(fleet, "fast-1") and status(fleet, "fast-1")["version"] == 1
