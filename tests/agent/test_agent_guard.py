"""An install stops before its switch at its deadline or when the channel that started it
closes (its stdin): for real, with a validly signed release whose library sleeps when loaded,
so the reference check would outlive both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from support.agent_processes import check_processes, wait_for
from support.agent_support import agent_cli, answer_json, current

from edgetune.agent.guard import ChangeStopped, SwitchGuard
from edgetune.agent.install import install_tarball

MODEL = "slowmlp"  # a model of its own: the session's mlp versions stay as the other tests know them
SLEEPING_LIBRARY_C = """
#include <unistd.h>
__attribute__((constructor)) static void sleep_on_load(void) { sleep(60); }
"""


@pytest.fixture(scope="module")
def slow_release(fleet, tmp_path_factory):
    """(good v1 tarball, v2 tarball whose library sleeps 60 s when loaded) of MODEL for gw-fast."""
    directory = tmp_path_factory.mktemp("sleeping")
    (directory / "sleep.c").write_text(SLEEPING_LIBRARY_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(directory / "sleep.so"), str(directory / "sleep.c")], check=True
    )
    good = fleet.publish(MODEL, "gw-fast", "slow-good")
    sleeping = fleet.publish(MODEL, "gw-fast", "slow-sleeping", library=(directory / "sleep.so").read_bytes())
    return good.tarball, sleeping.tarball


@pytest.fixture(scope="module")
def _installed_once():
    return {}


@pytest.fixture
def board_with_v1(_installed_once, make_board, slow_release, tmp_path):
    """A fresh copy of a root on which v1 of MODEL was installed (once per module)."""
    if "root" not in _installed_once:
        _installed_once["root"] = make_board()
        assert install_tarball(_installed_once["root"], MODEL, slow_release[0]).result == "installed"
    root = tmp_path / "copy" / "agent"
    shutil.copytree(_installed_once["root"], root, symlinks=True)
    return root


def test_the_guard_stops_a_child_at_the_deadline_and_not_after_commit():
    started = time.monotonic()
    with pytest.raises(ChangeStopped, match="deadline"), SwitchGuard(deadline_s=0.3):
        subprocess.run(["sleep", "30"])
    assert time.monotonic() - started < 5
    with SwitchGuard(deadline_s=0.2) as guard:
        guard.commit()
        time.sleep(0.4)  # the deadline passes after the commit: the run completes


def test_a_check_that_outlives_the_deadline_is_killed_and_nothing_switches(board_with_v1, slow_release):
    started = time.monotonic()
    status, record = agent_cli(
        board_with_v1, "install", "--model", MODEL, "--from", str(slow_release[1]), "--deadline-s", "3"
    )
    assert time.monotonic() - started < 20  # not the library's 60 s
    assert (status, record["result"], record["from_version"]) == (1, "failed", 1)
    assert "deadline (3 s, set by the rollout) passed before the switch" in record["error"]
    assert current(board_with_v1, MODEL) == "v1" and not check_processes(board_with_v1)
    assert not [p for p in (board_with_v1 / "releases" / MODEL).iterdir() if p.name.startswith(".staging-")]


def test_a_closed_channel_stops_the_install_before_the_switch(board_with_v1, slow_release):
    command = [
        sys.executable,
        "-m",
        "edgetune.agent",
        "--root",
        str(board_with_v1),
        "install",
        "--model",
        MODEL,
        "--from",
        str(slow_release[1]),
        "--abort-on-hangup",
        "--json",
    ]
    channel, our_end = os.pipe()
    agent = subprocess.Popen(command, stdin=channel, stdout=subprocess.PIPE, text=True)
    os.close(channel)
    try:
        wait_for(lambda: check_processes(board_with_v1), "the reference check to start")
        closed = time.monotonic()
        os.close(our_end)  # what sshd does when the connection that started the agent goes away
        output, _ = agent.communicate(timeout=20)
    finally:
        agent.kill()
    assert time.monotonic() - closed < 10
    record = answer_json("install", output)
    assert (agent.returncode, record["result"]) == (1, "failed") and "SSH channel" in record["error"]
    assert current(board_with_v1, MODEL) == "v1"
    wait_for(lambda: not check_processes(board_with_v1), "the check child to be gone")
