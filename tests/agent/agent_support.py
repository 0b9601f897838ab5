"""Helpers of the agent tests (imported by name: this folder is on sys.path during them)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
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


class CuttingProxy:
    """A TCP proxy to the artifact server that, while `cut_after` is set, closes the connection
    of the next tarball request after that many bytes of the response: a network cut."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.cut_after: int | None = None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as upstream:
            head = client.recv(65536)
            budget = None
            if b".tar.gz" in head.split(b"\r\n", 1)[0] and self.cut_after is not None:
                budget, self.cut_after = self.cut_after, None
            upstream.sendall(head)
            threading.Thread(target=_pipe, args=(client, upstream, None), daemon=True).start()
            _pipe(upstream, client, budget)


def _pipe(source: socket.socket, sink: socket.socket, budget: int | None) -> None:
    """Copy until EOF, or until `budget` bytes have passed (then cut both ways)."""
    try:
        while data := source.recv(65536):
            if budget is not None:
                data = data[:budget]
                budget -= len(data)
            sink.sendall(data)
            if budget == 0:
                break
        sink.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
