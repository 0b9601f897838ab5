"""Secrets written to a board are never readable by another user of it, not even for an instant.

A watcher running as `nobody` on the board's file system (a simulated board shares this
machine's) uses inotify to open every file the moment it appears in the directory a token is
written to, as an attacker on the board would, while the host writes tokens there over SSH.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from edgetune.fleet.ssh import BoardSession

NOBODY = 65534
TOKENS = 20

# inotify through ctypes (the standard library has no binding): open whatever is created or
# moved into the directory, print what could be read.
WATCHER = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
IN_CREATE, IN_MOVED_TO, IN_CLOSE_WRITE, IN_MODIFY = 0x100, 0x80, 0x8, 0x2
fd = libc.inotify_init()
directory = sys.argv[1].encode()
libc.inotify_add_watch(fd, directory, IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_MODIFY)
print("watching", flush=True)
opened = {}
while True:
    data = os.read(fd, 65536)
    offset = 0
    while offset < len(data):
        wd, mask, cookie, size = struct.unpack_from("iIII", data, offset)
        name = data[offset + 16: offset + 16 + size].rstrip(b"\0")
        offset += 16 + size
        path = os.path.join(directory, name)
        try:
            handle = opened.setdefault(path, open(path, "rb"))
            handle.seek(0)
            content = handle.read()
            if content:
                print("READ", name.decode(), content.decode(errors="replace"), flush=True)
        except OSError:
            pass
"""


@pytest.fixture
def public_directory():
    """A directory on the board that every user may read and enter, as a board's workdir is."""
    directory = Path(tempfile.mkdtemp(prefix="edgetune-secrets-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_token_written_to_a_board_is_never_readable_by_another_user(sim_fleet, public_directory):
    if not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs setpriv (util-linux) and /usr/bin/python3 to run the watcher as nobody")
    watcher = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            WATCHER,
            str(public_directory),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert watcher.stdout.readline().strip() == "watching", watcher.stderr.read()
        with BoardSession(sim_fleet.boards[0]) as session:
            for n in range(TOKENS):
                session.put_file(f"{public_directory}/token", f"secret-{n}".encode(), mode=0o600)
                session.put_file(f"{public_directory}/agent.json", b"{}", mode=0o644)
        time.sleep(0.5)
    finally:
        watcher.kill()
        out, err = watcher.communicate()
    assert "READ agent.json {}" in out  # the watcher works: it reads what it may
    assert "secret-" not in out, out
    assert (public_directory / "token").read_text() == f"secret-{TOKENS - 1}"
    assert (public_directory / "token").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in public_directory.iterdir()) == ["agent.json", "token"]  # no private directory left
