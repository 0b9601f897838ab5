"""Watching an agent's processes from the outside."""

from __future__ import annotations

import time
from pathlib import Path


def check_processes(root: Path | str) -> list[int]:
    """The live reference-check children of the agent at `root` (`... --root ROOT check ...`)."""
    root_arg = str(Path(root)).encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if root_arg in argv and b"check" in argv:
            found.append(int(cmdline.parent.name))
    return found


def wait_for(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
