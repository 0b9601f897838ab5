"""Per-board download tokens: bearer secrets that let a board see its own class's artifacts.

A board's token comes from the environment variable its inventory entry names (`token_env`),
else from `<deploy.tokens_dir>/<board>.token` (mode 0600). Tokens are never in YAML.
`ensure_token` makes a missing token file (for rollout, which provisions boards);
`TokenBook` finds the board a presented token belongs to, comparing in constant time and
re-reading files that changed (a rollout may add a token while the server runs).
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from edgetune.durable import write_atomic
from edgetune.errors import DeployError
from edgetune.inventory.schema import Board, Fleet

MIN_TOKEN_CHARS = 32


def token_path(fleet: Fleet, board: Board) -> Path:
    return _settings(fleet).tokens_dir / f"{board.name}.token"


def read_token(fleet: Fleet, board: Board) -> str | None:
    """The board's token, or None if it has none yet. A token file readable by others, or a
    token too short to be a secret, is an error."""
    if board.token_env is not None:
        value = os.environ.get(board.token_env)
        return _checked(value.strip(), f"${board.token_env}") if value else None
    path = token_path(fleet, board)
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise DeployError(f"cannot read the token of {board.name} ({path}): {err.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DeployError(f"the token file {path} is readable by others: chmod 600 {path}")
    return _checked(text, str(path))


def ensure_token(fleet: Fleet, board: Board) -> str:
    """The board's token, made (random, 256 bits) if it has none and comes from a file."""
    token = read_token(fleet, board)
    if token is not None:
        return token
    if board.token_env is not None:
        raise DeployError(f"{board.name}: its token comes from ${board.token_env}, which is not set")
    path = token_path(fleet, board)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    write_atomic(path, token.encode("ascii"), mode=0o600)
    return token


class TokenBook:
    """Which board a bearer token belongs to."""

    def __init__(self, fleet: Fleet):
        self._fleet = fleet
        self._cache: dict[str, tuple[object, str | None]] = {}

    def board_of(self, presented: str) -> Board | None:
        """The board whose token is `presented`; every board's token is compared (constant
        time each), so the answer's timing does not tell which board came close."""
        found = None
        given = presented.encode("utf-8", "replace")
        for board in self._fleet.boards:
            token = self._token(board)
            if token is not None and hmac.compare_digest(token.encode("utf-8"), given):
                found = board
        return found

    def _token(self, board: Board) -> str | None:
        if board.token_env is not None:
            return read_token(self._fleet, board)
        path = token_path(self._fleet, board)
        try:
            st = path.stat()
            version: object = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            version = None
        cached = self._cache.get(board.name)
        if cached is None or cached[0] != version:
            cached = (version, read_token(self._fleet, board) if version is not None else None)
            self._cache[board.name] = cached
        return cached[1]


def _checked(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise DeployError(f"the token in {where} is shorter than {MIN_TOKEN_CHARS} characters: not a usable secret")
    return token


def _settings(fleet: Fleet):
    if fleet.deploy is None:
        raise DeployError(f"{fleet.path} has no 'deploy' section (bind, url): add one to serve artifacts to boards")
    return fleet.deploy
