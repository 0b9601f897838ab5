"""Per-board download tokens: bearer secrets that let a board see its own class's artifacts.

A board's token comes from the environment variable its inventory entry names (`token_env`),
else from `<deploy.tokens_dir>/<board>.token` (mode 0600). Tokens are never in YAML.
`ensure_token` makes a missing token file (for rollout, which provisions boards);
`TokenBook` finds the board a presented token belongs to, comparing in constant time and
re-reading files whose content, mode or owner changed (a rollout may add a token while the
server runs). A board whose token is unusable (a file readable by others, a symbolic link, a
token too short or too long) or is also another board's is refused, with one log line each time
its problem changes; the other boards are served as before.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import threading
from pathlib import Path

from edgetune.durable import write_atomic
from edgetune.errors import DeployError
from edgetune.inventory.schema import Board, Fleet

MIN_TOKEN_CHARS = 32
MAX_TOKEN_CHARS = 512
_REMAKE = "remove it and re-run `edgetune rollout` (it makes a new token and gives it to the board)"

log = logging.getLogger(__name__)


def token_path(fleet: Fleet, board: Board) -> Path:
    return _settings(fleet).tokens_dir / f"{board.name}.token"


def token_source(fleet: Fleet, board: Board) -> str:
    """Where the board's token comes from: `$VARIABLE` or the token file's path."""
    return f"${board.token_env}" if board.token_env is not None else str(token_path(fleet, board))


def read_token(fleet: Fleet, board: Board) -> str | None:
    """The board's token, or None if it has none yet. A token file readable by others or that
    is a symbolic link, or a token that cannot be a secret, is an error."""
    if board.token_env is not None:
        value = os.environ.get(board.token_env)
        return _checked(value.strip(), f"${board.token_env}", "set it to another secret") if value else None
    path = token_path(fleet, board)
    text = read_secret_file(path, "the token file", MAX_TOKEN_CHARS + 2, _REMAKE)
    return None if text is None else _checked(text, str(path), _REMAKE)


def read_secret_file(path: Path, what: str, max_chars: int, remake: str) -> str | None:
    """The stripped text of the secret in `path` (at most `max_chars` read), None if there is
    no such file; a symbolic link, a file that is not a regular one or that others may read is
    a DeployError naming `what` and saying what to do (`remake`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise DeployError(f"cannot read {what} {path}: {err.strerror}; {remake}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DeployError(f"{what} {path} is not a regular file; {remake}")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise DeployError(f"{what} {path} is readable by others (mode {stat.S_IMODE(mode):04o}): chmod 600 {path}")
        return f.read(max_chars).decode("ascii", "replace").strip()


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
    """Which board a bearer token belongs to (safe to use from several threads)."""

    def __init__(self, fleet: Fleet):
        self._fleet = fleet
        self._files: dict[str, tuple[tuple[int, ...] | None, str | None, str | None]] = {}
        self._reported: dict[str, str] = {}
        self._lock = threading.Lock()

    def board_of(self, presented: str) -> Board | None:
        """The board whose token is `presented`; every usable token is compared (constant time
        each), so the answer's timing does not tell which board came close."""
        found = None
        given = presented.encode("utf-8", "replace")
        for board, token in self.usable():
            if hmac.compare_digest(token.encode("utf-8"), given):
                found = board
        return found

    def usable(self) -> list[tuple[Board, str]]:
        """(board, token) of every board that may download now. Why each other board may not is
        logged once per change of its problem."""
        with self._lock:
            tokens: dict[str, str] = {}
            problems: dict[str, str] = {}
            for board in self._fleet.boards:
                token, problem = self._token(board)
                if problem is not None:
                    problems[board.name] = problem
                elif token is not None:
                    tokens[board.name] = token
            for names in _sharing(tokens):
                for name in names:
                    problems[name] = self._shared_problem(names)
                    del tokens[name]
            self._report(problems)
            return [(board, tokens[board.name]) for board in self._fleet.boards if board.name in tokens]

    def _token(self, board: Board) -> tuple[str | None, str | None]:
        """(token, None), (None, None) if it has none yet, or (None, why it is unusable)."""
        if board.token_env is not None:
            return _attempt(lambda: read_token(self._fleet, board))
        key = _file_key(token_path(self._fleet, board))
        cached = self._files.get(board.name)
        if cached is None or cached[0] != key:
            cached = (key, *_attempt(lambda: read_token(self._fleet, board)))
            self._files[board.name] = cached
        return cached[1], cached[2]

    def _shared_problem(self, names: list[str]) -> str:
        sources = ", ".join(f"{name}: {token_source(self._fleet, self._fleet.board(name))}" for name in names)
        return (
            f"boards {' and '.join(names)} have the same token ({sources}): each is refused until it has its "
            f"own; give all but one a new token (for a token file, {_REMAKE}; for a variable, set another value)"
        )

    def _report(self, problems: dict[str, str]) -> None:
        for board in self._fleet.boards:
            problem, before = problems.get(board.name), self._reported.get(board.name)
            if problem is not None and problem != before:
                log.warning("board %s may not download: %s", board.name, problem)
                self._reported[board.name] = problem
            elif problem is None and before is not None:
                log.warning("board %s may download again: its token is usable", board.name)
                del self._reported[board.name]


def _attempt(read) -> tuple[str | None, str | None]:
    try:
        return read(), None
    except DeployError as err:
        return None, str(err)


def _file_key(path: Path) -> tuple[int, ...] | None:
    """What changes when the file's content, mode, owner or identity changes (None: no file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return ()
    return (st.st_ino, st.st_dev, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sharing(tokens: dict[str, str]) -> list[list[str]]:
    """Groups of boards (two or more) that have the same token."""
    by_token: dict[str, list[str]] = {}
    for name, token in tokens.items():
        by_token.setdefault(token, []).append(name)
    return [names for names in by_token.values() if len(names) > 1]


def _checked(token: str, where: str, remedy: str) -> str:
    """`token` if it can be a secret sent in an HTTP header; else why not, and `remedy`."""
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        raise DeployError(
            f"the token in {where} is {len(token)} characters long, not {MIN_TOKEN_CHARS} to "
            f"{MAX_TOKEN_CHARS}: not a usable secret; {remedy}"
        )
    if not all("!" <= c <= "~" for c in token):
        raise DeployError(
            f"the token in {where} holds spaces or characters that are not printable ASCII "
            f"(unusable in an HTTP header); {remedy}"
        )
    return token


def _settings(fleet: Fleet):
    if fleet.deploy is None:
        raise DeployError(f"{fleet.path} has no 'deploy' section (bind, url): add one to serve artifacts to boards")
    return fleet.deploy
