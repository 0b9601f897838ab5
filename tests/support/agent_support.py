"""Helpers of the agent tests: a free port, the current release, the agent run in a subprocess and its answer read back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from edgetune.agent.answer import last_json_object
from edgetune.deploy.remote import answer_of


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def current(root: Path, model: str = "mlp") -> str | None:
    """Where the board's `current` link points (None: no link)."""
    link = root / "releases" / model / "current"
    return os.readlink(link) if link.is_symlink() else None


def agent_cli(root: Path, *args: str, env: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    """`python -m edgetune.agent --root ROOT ARGS --json` in a subprocess: (exit status, its answer
    as `answer_json` reads it)."""
    command = [sys.executable, "-m", "edgetune.agent", "--root", str(root), *args, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    return done.returncode, answer_json(args[0], done.stdout, done.stderr)


def answer_json(verb: str, stdout: str, stderr: str = "") -> dict:
    """The agent's answer to `verb` in its `stdout`, checked as the host checks it (schema, version,
    verb): the verb's record as plain data, or `{"error": ...}` when the verb failed."""
    line = last_json_object(stdout)
    if line is None:
        raise AssertionError(f"no answer from the agent:\n{stdout}\n{stderr}")
    answer = answer_of("board", verb, line)
    return dict(answer.record) if answer.error is None else {"error": answer.error}
