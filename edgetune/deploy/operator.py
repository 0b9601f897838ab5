"""The operator token: the secret that opens the server's `/dashboard`, and nothing a board
may see. It lives in `<fleet.workdir>/deploy/operator.token` (mode 0600, beside the boards'
`tokens/` directory but never given to a board), made by `edgetune keys init` or on the first
`edgetune serve`, and stored as it is sent (the operator must be able to read it back, as the
host must read the boards' tokens to provision them). The server compares a presented token
in constant time; a board's token is refused as one.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from edgetune.deploy.tokens import read_secret_file
from edgetune.durable import write_atomic
from edgetune.errors import DeployError
from edgetune.inventory.schema import Fleet

TOKEN_BYTES = 32
_REMAKE = "remove it and run `edgetune keys init --if-missing` (it makes a new one)"


def operator_token_path(fleet: Fleet) -> Path:
    return Path(fleet.workdir) / "deploy" / "operator.token"


def ensure_operator_token(fleet: Fleet) -> tuple[Path, bool]:
    """(the token file, whether it was made now): made, random, if missing."""
    path = operator_token_path(fleet)
    if read_operator_token(fleet) is not None:
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, secrets.token_urlsafe(TOKEN_BYTES).encode("ascii"), mode=0o600)
    return path, True


def read_operator_token(fleet: Fleet) -> str | None:
    """The operator token, None if there is none; a file that is not a regular 0600 one, or
    that holds no usable token, is a DeployError."""
    path = operator_token_path(fleet)
    token = read_secret_file(path, "the operator token", 1024, _REMAKE)
    if token is None:
        return None
    if len(token) < TOKEN_BYTES or not all("!" <= c <= "~" for c in token):
        raise DeployError(
            f"the operator token {path} is not a usable secret (at least {TOKEN_BYTES} printable characters); {_REMAKE}"
        )
    return token


def is_operator_token(fleet: Fleet, presented: str) -> bool:
    """Whether `presented` is the operator token (compared in constant time; no token: never)."""
    token = read_operator_token(fleet)
    return token is not None and hmac.compare_digest(token.encode("utf-8"), presented.encode("utf-8", "replace"))
