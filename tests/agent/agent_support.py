"""Helpers of the agent tests (imported by name: this folder is on sys.path during them)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def current(root: Path, model: str = "mlp") -> str | None:
    """Where the board's `current` link points (None: no link)."""
    link = root / "releases" / model / "current"
    return os.readlink(link) if link.is_symlink() else None


def agent_cli(root: Path, *args: str, env: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    """`python -m edgetune.agent --root ROOT ARGS --json` in a subprocess: (exit status, JSON)."""
    command = [sys.executable, "-m", "edgetune.agent", "--root", str(root), *args, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    try:
        return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise AssertionError(f"no JSON from the agent (exit {done.returncode}):\n{done.stdout}\n{done.stderr}") from None
