"""Installing from local tarballs (no server): install -> check -> commit, every refusal
leaving `current` and the state untouched, rollback, pruning, and a killed install."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent_support import current

from edgetune.agent.install import install_tarball, rollback
from edgetune.artifact_format.files import pack_tarball
from edgetune.artifact_format.signing import init_keys, load_private_key, sign


def _state(root: Path) -> dict:
    return json.loads((root / "state.json").read_text())["models"]["mlp"]


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "releases" / "mlp").iterdir() if p.name.startswith("."))


def _installed(root: Path, tarball: Path, version: int) -> None:
    record = install_tarball(root, "mlp", tarball)
    assert (record.result, record.to_version, record.error) == ("installed", version, None)


def test_install_v1_then_v2_then_unchanged(make_board, fleet):
    root = make_board()
    first = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 1))
    assert (first.board, first.result, first.from_version, first.to_version, first.error) == (
        "fast-1",
        "installed",
        None,
        1,
        None,
    )
    assert current(root) == "v1"
    assert (root / "releases" / "mlp" / "v1" / "model.so").read_bytes() == fleet.compiled.library
    second = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert (second.result, second.from_version, second.to_version) == ("installed", 1, 2)
    assert current(root) == "v2"
    state = _state(root)
    assert (state["version"], state["previous"], state["highest_installed"]) == (2, 1, 2)
    assert state["firmware"] == os.popen("uname -srm").read().strip()
    again = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert (again.result, again.from_version, again.to_version) == ("unchanged", 2, 2)
    assert _leftovers(root) == []


def test_replayed_older_version_is_refused_unless_downgrade_is_allowed(board_on, fleet):
    root = board_on(1, 2)
    state_before = (root / "state.json").read_bytes()
    replay = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 1))
    assert (replay.result, replay.from_version, replay.to_version) == ("failed", 2, 1)
    assert "older than v2" in replay.error and "rollback" in replay.error
    assert current(root) == "v2" and (root / "state.json").read_bytes() == state_before
    operator = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 1), allow_downgrade=True)
    assert operator.result == "installed" and current(root) == "v1"
    assert _state(root)["highest_installed"] == 2


def _repacked(source: Path, directory: Path, edit) -> Path:
    """A copy of version directory `source`, changed by `edit(copy)`, packed as a tarball."""
    copy = directory / "copy"
    shutil.copytree(source, copy)
    edit(copy)
    tarball = directory / "v9.tar.gz"
    tarball.write_bytes(pack_tarball(copy))
    return tarball


def _flip_library_byte(copy: Path) -> None:
    library = bytearray((copy / "model.so").read_bytes())
    library[len(library) // 2] ^= 0xFF
    (copy / "model.so").write_bytes(bytes(library))


def _edit_manifest(copy: Path) -> None:
    raw = json.loads((copy / "manifest.json").read_bytes())
    raw["version"] = 99
    (copy / "manifest.json").write_bytes(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode())


def _sign_with_another_key(copy: Path) -> None:
    pair = init_keys(copy.parent / "other.key", copy.parent / "other.pub", copy.parent / "artifacts")
    data = (copy / "manifest.json").read_bytes()
    (copy / "manifest.sig").write_bytes(sign(load_private_key(pair.private_key), data).to_bytes())


@pytest.mark.parametrize(
    "make_tarball, refusal",
    [
        (lambda fleet, tmp: _repacked(fleet.store.get("mlp", "gw-fast", 2).path, tmp, _flip_library_byte), "model.so"),
        (
            lambda fleet, tmp: _repacked(fleet.store.get("mlp", "gw-fast", 2).path, tmp, _edit_manifest),
            "signature does not match the manifest's bytes",
        ),
        (
            lambda fleet, tmp: _repacked(fleet.store.get("mlp", "gw-fast", 2).path, tmp, _sign_with_another_key),
            "signed by key",
        ),
        (lambda fleet, tmp: fleet.tarball("mlp", "gw-slow", 1), "for class gw-slow, this board is of class gw-fast"),
        (lambda fleet, tmp: fleet.tarball("other", "gw-fast", 1), "of model other, not mlp"),
        (lambda fleet, tmp: _cut(fleet.tarball("mlp", "gw-fast", 2), tmp), "truncated or corrupt"),
    ],
    ids=["tampered-library", "tampered-manifest", "another-key", "another-class", "another-model", "truncated"],
)
def test_refused_artifacts_leave_the_board_on_its_release(board_on, fleet, tmp_path, make_tarball, refusal):
    root = board_on(1)
    state_before = (root / "state.json").read_bytes()
    record = install_tarball(root, "mlp", make_tarball(fleet, tmp_path))
    assert record.result == "failed" and refusal in record.error, record.error
    assert current(root) == "v1" and (root / "state.json").read_bytes() == state_before
    assert sorted(p.name for p in (root / "releases" / "mlp").iterdir()) == ["current", "v1"]


def _cut(tarball: Path, directory: Path) -> Path:
    cut = directory / "cut.tar.gz"
    cut.write_bytes(tarball.read_bytes()[: tarball.stat().st_size // 2])
    return cut


@pytest.mark.parametrize(
    "version, refusal",
    [(2, "the library crashed the reference check (SIGSEGV)"), (3, "reference check"), (4, "output0: max |error|")],
    ids=["library-crashes-on-load", "library-cut-in-half", "wrong-output"],
)
def test_validly_signed_broken_artifact_is_refused_by_the_reference_check(board_on, fleet, version, refusal):
    root = board_on(1, board="bad-1")
    record = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-bad", version))
    assert (record.result, record.from_version, record.to_version) == ("failed", 1, version)
    assert refusal in record.error, record.error
    assert current(root) == "v1" and _state(root)["highest_installed"] == 1
    assert sorted(p.name for p in (root / "releases" / "mlp").iterdir()) == ["current", "v1"]


def test_rollback_down_and_back_up_keeps_the_high_water_mark(board_on, fleet):
    root = board_on(1, 2)
    down = rollback(root, "mlp")
    assert (down.result, down.from_version, down.to_version) == ("rolled_back", 2, 1)
    assert current(root) == "v1"
    assert (_state(root)["version"], _state(root)["previous"], _state(root)["highest_installed"]) == (1, 2, 2)
    nothing_below = rollback(root, "mlp")
    assert nothing_below.result == "failed" and "no kept release of mlp below v1" in nothing_below.error
    assert install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 1)).result == "unchanged"
    up = rollback(root, "mlp", to=2)
    assert (up.result, up.to_version) == ("rolled_back", 2) and current(root) == "v2"
    missing = rollback(root, "mlp", to=3)
    assert missing.result == "failed" and "v3 of mlp is not kept" in missing.error and current(root) == "v2"


def test_rollback_refuses_a_release_damaged_on_disk(board_on):
    root = board_on(1, 2)
    _flip_library_byte(root / "releases" / "mlp" / "v1")
    record = rollback(root, "mlp")
    assert record.result == "failed" and "model.so: sha256" in record.error
    assert current(root) == "v2"


def test_deactivate_then_reactivate(board_on):
    root = board_on(1)
    off = rollback(root, "mlp", deactivate=True)
    assert (off.result, off.from_version, off.to_version) == ("deactivated", 1, None)
    assert current(root) is None and _state(root)["version"] is None
    assert (root / "releases" / "mlp" / "v1").is_dir()
    on = rollback(root, "mlp", to=1)
    assert (on.result, on.from_version, on.to_version) == ("rolled_back", None, 1) and current(root) == "v1"


def test_pruning_keeps_the_newest_and_never_the_current_or_previous(make_board, fleet):
    root = make_board(keep_releases=2)
    for version in (1, 2):
        _installed(root, fleet.tarball("mlp", "gw-fast", version), version)
    assert rollback(root, "mlp").to_version == 1
    _installed(root, fleet.tarball("mlp", "gw-fast", 3), 3)  # current v3, previous v1: v2 goes
    assert sorted(p.name for p in (root / "releases" / "mlp").iterdir()) == ["current", "v1", "v3"]


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait_until_group_is_gone(pgid: int, timeout_s: float = 10) -> None:
    """Until no live process of the group is left (a killed child may still be exiting)."""
    deadline = time.monotonic() + timeout_s
    while any(_live_member(stat, pgid) for stat in Path("/proc").glob("[0-9]*/stat")):
        assert time.monotonic() < deadline, f"process group {pgid} is still alive"
        time.sleep(0.01)


def _live_member(stat: Path, pgid: int) -> bool:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[2]) == pgid and fields[0] != "Z"


@pytest.mark.parametrize("moment", ["staging-created", "reference-check-running"])
def test_killed_install_leaves_the_previous_release_and_the_next_install_succeeds(board_on, fleet, moment):
    root = board_on(1)
    state_before = (root / "state.json").read_bytes()
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
    ]
    agent = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (_leftovers(root) and (moment == "staging-created" or _children(agent.pid))):
            assert agent.poll() is None and time.monotonic() < deadline, "the install ended before the kill"
            time.sleep(0.005)
    finally:
        os.killpg(agent.pid, signal.SIGKILL)  # the agent and its check child: a power cut
        agent.wait()
        _wait_until_group_is_gone(agent.pid)
    assert current(root) == "v1" and (root / "state.json").read_bytes() == state_before
    record = install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2))
    assert (record.result, record.from_version, record.to_version) == ("installed", 1, 2)
    assert current(root) == "v2" and _leftovers(root) == []
