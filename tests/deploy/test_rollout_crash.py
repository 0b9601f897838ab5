"""A host killed in the middle of a rollout (SIGKILL: nothing of the rollout's own runs after it)
leaves a record that does not lie, `fleet status` reads the boards it touched back, and the next
rollout that stops rolls back the boards the killed one switched.

The rollout killed is `edgetune rollout` in a process (and process group) of its own, killed by
its PID at a point found by watching what it writes and what the boards do: its intent journal
showing the second stage planned, or the agent of the second stage's board running its reference
check. On the simulated fleet (`released_fleet`, tests/conftest.py), its gw-fast boards, the real
agent and the real server; the releases are copies of the built mlp under a model of this
module's own (`mlp-crash`): v1 and v2 as built, v3 with a library that sleeps 90 s when loaded.
fast-1 is pinned to v2 and fast-2 gets the newest, so a rollout of gw-fast switches the canary
fast-1 to v2 at once, then fast-2 checks v3 for as long as it is let. On the loopback fleet
(tests/deploy/conftest.py), the journal's lock and decoding.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.agent_processes import check_processes, wait_for
from support.artifact_server import RunningServer
from support.deploy_support import publish_copy, sleeping_library
from support.inventory_dump import fleet_to_dict

from edgetune.cli import main
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.rollout import plan_rollout, rollout
from edgetune.deploy.rollout_journal import RolloutJournal, RolloutUnderWay, journal_path, read_journal
from edgetune.errors import DeployError
from edgetune.fleet.agent_bundle import agent_root
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.state import UNKNOWN, load_deployed
from edgetune.inventory import load_fleet

REPO = Path(__file__).resolve().parents[2]
MODEL = "mlp-crash"
FAST = ("fast-1", "fast-2")


@pytest.fixture(scope="module")
def fleet(released_fleet, tmp_path_factory):
    """released_fleet with MODEL declared, fast-1 pinned to its v2, written as a fleet.yaml the killed
    rollouts load; v1, v2 and v3 (sleeping) published, and served."""
    directory = tmp_path_factory.mktemp("rollout-crash")
    sleeping = sleeping_library(directory)
    mlp = next(m for m in released_fleet.models if m.name == "mlp")
    boards = tuple(
        dataclasses.replace(b, pin={**b.pin, MODEL: 2}) if b.name == "fast-1" else b for b in released_fleet.boards
    )
    declared = released_fleet.replace(
        models=(*released_fleet.models, dataclasses.replace(mlp, name=MODEL)), boards=boards
    )
    (directory / "fleet.yaml").write_text(yaml.safe_dump(fleet_to_dict(declared)))
    fleet = load_fleet(directory / "fleet.yaml")
    # the killed rollouts' inventory is this one (its CA and server certificate beside its signing key)
    assert (
        fleet.replace(path=declared.path, deploy=dataclasses.replace(fleet.deploy, tls=declared.deploy.tls)) == declared
    )
    versions = [
        publish_copy(fleet, MODEL, "gw-fast", tag, library).version
        for tag, library in (("v1", None), ("v2", None), ("v3-sleeps", sleeping))
    ]
    assert versions == [1, 2, 3]
    server = RunningServer(fleet)
    try:
        yield fleet
    finally:
        server.stop()


@pytest.fixture
def on_v1(fleet):
    """Both gw-fast boards run v1, no rollout journal of MODEL: where each case starts."""
    result = rollout(fleet, plan_rollout(fleet, MODEL, classes=["gw-fast"], version=1, canary=0))
    assert result.ok, result.records()
    assert running(fleet) == {"fast-1": 1, "fast-2": 1} and not journal_path(fleet, MODEL).exists()
    return fleet


def running(fleet) -> dict[str, int | None]:
    """What each gw-fast board's agent says it runs of MODEL."""
    found = {}
    for name in FAST:
        with BoardSession(fleet.board(name)) as session:
            found[name] = RemoteAgent(session, fleet).call("status")["models"].get(MODEL, {}).get("version")
    return found


def recorded(fleet) -> dict[str, int | str | None]:
    """What deployed.json (what `fleet status` shows) says each gw-fast board runs of MODEL."""
    deployed = load_deployed(fleet)
    return {name: deployed.get(name, {}).get(MODEL) for name in FAST}


def checking(fleet, name: str) -> list[int]:
    return check_processes(agent_root(fleet.board(name)))


def second_stage_planned(fleet) -> bool:
    journal = read_journal(fleet, MODEL)
    return journal is not None and "fast-2" in journal.boards


def second_stage_checking(fleet) -> bool:
    return bool(checking(fleet, "fast-2"))


def killed_rollout(fleet, tmp_path, when, *options: str) -> None:
    """`edgetune rollout` of gw-fast (fast-1 canary, then fast-2; `options` added) in its own
    process group, killed with SIGKILL by its PID as soon as `when(fleet)` holds."""
    log = tmp_path / "rollout.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edgetune",
                "rollout",
                "-f",
                str(fleet.path),
                "--model",
                MODEL,
                "--class",
                "gw-fast",
                "--timeout-s",
                "120",
                *options,
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while not when(fleet):
            assert process.poll() is None, f"the rollout ended before it was killed:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the rollout never reached the point to kill it at:\n{log.read_text()}"
            time.sleep(0.05)  # `checking` reads every process's command line; each point lasts seconds
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@pytest.mark.parametrize(
    "when", [second_stage_planned, second_stage_checking], ids=["after-the-canary-stage", "in-the-second-stage"]
)
def test_a_rollout_killed_leaves_a_true_record_and_the_next_one_rolls_its_switch_back(on_v1, tmp_path, capsys, when):
    fleet = on_v1
    killed_rollout(fleet, tmp_path, when)

    # What the killed rollout recorded: the canary's switch to v2, as it happened; fast-2 as it was, or
    # `unknown` if its install had been started (it had, when killed in its check).
    after_kill = recorded(fleet)
    assert after_kill["fast-1"] == 2
    assert after_kill["fast-2"] == UNKNOWN if when is second_stage_checking else after_kill["fast-2"] in (1, UNKNOWN)
    assert journal_path(fleet, MODEL).exists()
    wait_for(
        lambda: not checking(fleet, "fast-2"), "fast-2's agent to stop its check (its channel is gone)", timeout_s=20
    )
    assert running(fleet) == {"fast-1": 2, "fast-2": 1}
    assert all(after_kill[name] in (now, UNKNOWN) for name, now in running(fleet).items())

    # `fleet status` reads the boards the killed rollout touched back, shows what they run, and says
    # the rollout was interrupted and what to run; the journal stays for the next rollout.
    main(["fleet", "status", "-f", str(fleet.path), "--json"])
    out, err = capsys.readouterr()
    shown = {board["name"]: board["deployed"].get(MODEL) for board in json.loads(out) if board["name"] in FAST}
    assert shown == recorded(fleet) == running(fleet) == {"fast-1": 2, "fast-2": 1}
    assert f"a rollout of {MODEL} (pid" in err and "was interrupted" in err
    assert f"run `edgetune rollout -f {fleet.path} --model {MODEL}`" in err and "fast-1 (back to v1)" in err
    assert journal_path(fleet, MODEL).exists()

    # The next rollout's canary stage (both boards) fails on fast-2 (v3's check outlives the agent's 6 s
    # deadline); fast-1, on v2 already (`unchanged` for it), was switched by the killed rollout: rolled back.
    result = rollout(fleet, plan_rollout(fleet, MODEL, classes=["gw-fast"], canary=2, timeout_s=8))
    records = {record["board"]: record for record in result.records()}
    assert "canary gw-fast" in result.stopped and list(records) == list(FAST)
    fast_1, fast_2 = records["fast-1"], records["fast-2"]
    assert (fast_1["result"], fast_1["from_version"], fast_1["to_version"], fast_1["runs"]) == ("rolled_back", 1, 2, 1)
    assert (fast_2["result"], fast_2["from_version"], fast_2["to_version"], fast_2["runs"]) == ("failed", 1, 3, 1)
    wait_for(lambda: not checking(fleet, "fast-2"), "fast-2's agent to stop its check at its deadline", timeout_s=20)
    assert recorded(fleet) == running(fleet) == {"fast-1": 1, "fast-2": 1}
    assert not journal_path(fleet, MODEL).exists()  # the rollout ended: its journal is closed


def test_a_rollout_killed_in_its_canarys_check_leaves_the_canary_unknown_until_read_back(on_v1, tmp_path, capsys):
    """Killed in the first stage, while the canary (fast-1, given v3, whose check sleeps) checks:
    the record says fast-1 is `unknown`, never that it switched; its agent stops (its channel is
    gone) and it still runs v1; `fleet status` reads it back and shows v1; the next rollout, which
    finds nothing switched, rolls nothing back and closes the journal."""
    fleet = on_v1
    killed_rollout(fleet, tmp_path, lambda f: bool(checking(f, "fast-1")), "--version", "3")
    assert recorded(fleet) == {"fast-1": UNKNOWN, "fast-2": 1} and journal_path(fleet, MODEL).exists()
    wait_for(
        lambda: not checking(fleet, "fast-1"), "fast-1's agent to stop its check (its channel is gone)", timeout_s=20
    )
    assert running(fleet) == {"fast-1": 1, "fast-2": 1}

    main(["fleet", "status", "-f", str(fleet.path), "--json"])
    out, err = capsys.readouterr()
    shown = {board["name"]: board["deployed"].get(MODEL) for board in json.loads(out) if board["name"] in FAST}
    assert shown == recorded(fleet) == running(fleet) == {"fast-1": 1, "fast-2": 1}
    assert f"a rollout of {MODEL} (pid" in err and "was interrupted" in err and "back to" not in err

    result = rollout(fleet, plan_rollout(fleet, MODEL, classes=["gw-fast"], version=1, canary=0))
    assert result.ok and {record["result"] for record in result.records()} == {"unchanged"}, result.records()
    assert recorded(fleet) == running(fleet) == {"fast-1": 1, "fast-2": 1} and not journal_path(fleet, MODEL).exists()


def test_a_second_rollout_of_a_model_under_way_is_refused_and_a_damaged_journal_named(
    deploy_fleet, published, artifact_server
):
    """On the loopback fleet (nothing reaches a board): the journal of mlp held as a rollout holds it."""
    plan = plan_rollout(deploy_fleet, "mlp")
    with RolloutJournal.held(deploy_fleet, "mlp") as journal:
        journal.plan_stage("canary gw-fast", {"fast-1": 2})
        with pytest.raises(
            RolloutUnderWay,
            match=rf"a rollout of mlp is under way on this host \(its journal last written by pid {os.getpid()}\)",
        ):
            rollout(deploy_fleet, plan)
    path = journal_path(deploy_fleet, "mlp")
    path.write_text(path.read_text().replace('"target":2', '"target":"2"'))
    with pytest.raises(DeployError, match=rf"{path}: boards.fast-1.target: must be an integer.*damaged or edited"):
        rollout(deploy_fleet, plan)
    assert load_deployed(deploy_fleet) == {}  # nothing was touched or recorded
