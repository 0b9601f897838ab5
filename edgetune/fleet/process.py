"""Host processes we start and stop: detached process groups, recognised by their command line.

A recorded PID is only acted on while /proc shows the command we started under it, so a PID
reused by the system after a reboot or crash is never signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

POLL_S = 0.1


def spawn_detached(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` as the leader of a new session (so of its own process group), output to
    `log_path`, with our environment and `env`. It outlives us: whoever stops it later finds it by
    PID and command line."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = None if env is None else {**os.environ, **env}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=environment
        )


def running(pid: int | None, marker: str) -> bool:
    """True when `pid` is alive and its command line contains `marker`."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return marker in cmdline and state != "Z"


def stop_group(pid: int | None, marker: str, grace_s: float = 3.0) -> bool:
    """SIGTERM the process group led by `pid` (if it is still ours), SIGKILL after `grace_s`.
    Returns whether there was anything to stop."""
    if not running(pid, marker):
        return False
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while running(pid, marker) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(POLL_S)
    _signal_group(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Collect our own exited child, if it is one (it is when started by this very process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def port_answers(host: str, port: int, timeout: float = 5.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(predicate, timeout_s: float, interval_s: float = POLL_S) -> bool:
    """Poll `predicate()` until it is true or `timeout_s` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
