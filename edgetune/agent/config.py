"""The agent's configuration, `<root>/agent.json`, written by the operator's rollout.

Schema `edgetune.agent-config` version 1, canonical JSON:
`{"schema", "schema_version", "board", "device_class", "server", "token_file", "public_key",
"server_ca", "keep_releases", "firmware_command", "threads"}`, and `"hooks"` when a model has
any: `{<model>: {"on_switch": command or null, "health": {"command", "timeout_s"} or null}}`
(fleet.yaml's `models[].on_switch` and `models[].health`; see hooks.py). A file without it
reads as before: no hooks. `token_file`, `public_key` and
`server_ca` are relative to the agent's root unless absolute. `server_ca` (the fleet CA, PEM) is
required for an https:// server and must be null for http:// (`deploy.tls: false`). The rollout
calls `write_config` (or `config_bytes`) on the host; the agent calls `load_config` and refuses
a bad file naming the field at fault.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from edgetune.agent.errors import AgentConfigError
from edgetune.artifact_format.codec import added_field, canonical_bytes, load_versioned, to_json
from edgetune.durable import write_atomic

if TYPE_CHECKING:  # imported where used: `status` and the other verbs that need no key start faster
    import ssl

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

CONFIG_NAME = "agent.json"
CONFIG_SCHEMA = "edgetune.agent-config"
CONFIG_SCHEMA_VERSION = 1
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MIN_TOKEN_CHARS = 32
HEALTH_TIMEOUT_S = (1.0, 3600.0)  # the range of a health check's timeout (as fleet.yaml allows)
MAX_COMMAND_CHARS = 4096


@dataclass(frozen=True)
class HealthCheck:
    command: str  # run by the shell after the switch (and on_switch); exit 0: healthy
    timeout_s: float  # no exit within it: unhealthy (its process group is killed)


@dataclass(frozen=True)
class ModelHooks:
    """What the agent runs around a switch of a model's `current` (hooks.py)."""

    on_switch: str | None = None  # run by the shell after every switch (install, rollback, the switch back)
    health: HealthCheck | None = None  # after an install's switch; unhealthy: the board switches back

    def problems(self, model: str) -> list[str]:
        where, problems = f"hooks.{model}", []
        if not SAFE_NAME.fullmatch(model):
            problems.append(f"hooks: {model!r} is not a valid model name")
        commands = {"on_switch": self.on_switch, "health.command": self.health.command if self.health else None}
        for name, command in commands.items():
            if command is not None and (not command.strip() or "\0" in command or len(command) > MAX_COMMAND_CHARS):
                problems.append(
                    f"{where}.{name}: must be a shell command (not empty, no NUL, at most "
                    f"{MAX_COMMAND_CHARS} characters)"
                )
        if self.health is not None:
            low, high = HEALTH_TIMEOUT_S
            if not (math.isfinite(self.health.timeout_s) and low <= self.health.timeout_s <= high):
                problems.append(
                    f"{where}.health.timeout_s: must be between {low:g} and {high:g} seconds, "
                    f"not {self.health.timeout_s}"
                )
        return problems


@dataclass(frozen=True)
class AgentConfig:
    board: str  # this board's name in the inventory
    device_class: str  # the only class whose artifacts it accepts
    server: str  # base URL of `edgetune serve`, e.g. https://10.231.7.1:8470
    token_file: str  # the board's bearer token (mode 0600)
    public_key: str  # the fleet's ed25519 public key (PEM): the only key trusted
    server_ca: str | None  # the fleet CA (PEM): the only authority trusted for an https:// server
    keep_releases: int  # releases kept on the board, at least 2 (the current and previous ones always)
    firmware_command: str  # shell command printing the firmware fingerprint
    threads: int  # TVM_NUM_THREADS for checks and runs
    hooks: Mapping[str, ModelHooks] | None = added_field()  # per model; None (not written): no model has any

    def hooks_of(self, model: str) -> ModelHooks:
        """The hooks of `model` (none: an empty ModelHooks)."""
        return (self.hooks or {}).get(model) or ModelHooks()

    def problems(self) -> list[str]:
        """`field: what is wrong` for each invalid value (types are checked on load)."""
        problems = []
        for name in ("board", "device_class"):
            if not SAFE_NAME.fullmatch(getattr(self, name)):
                problems.append(f"{name}: {getattr(self, name)!r} is not a valid name")
        url = urlsplit(self.server)
        if url.scheme not in ("http", "https") or not url.netloc or url.query or url.fragment:
            problems.append(f"server: {self.server!r} is not an http(s)://HOST:PORT URL")
        if url.scheme == "https" and not (self.server_ca or "").strip():
            problems.append("server_ca: an https:// server needs the fleet CA file the rollout provisions")
        if url.scheme == "http" and self.server_ca is not None:
            problems.append("server_ca: must be null for an http:// server (or the server https://)")
        for name in ("token_file", "public_key", "firmware_command"):
            if not getattr(self, name).strip():
                problems.append(f"{name}: must not be empty")
        if self.keep_releases < 2:
            problems.append(
                f"keep_releases: must be at least 2 (the current and the previous release), not {self.keep_releases}"
            )
        if self.threads < 1:
            problems.append(f"threads: must be at least 1, not {self.threads}")
        for model, hooks in sorted((self.hooks or {}).items()):
            problems.extend(hooks.problems(model))
        return problems

    def path_of(self, root: Path, value: str) -> Path:
        """`token_file`, `public_key` or `server_ca` resolved against the agent's root."""
        return Path(root) / value


def config_bytes(config: AgentConfig) -> bytes:
    """The canonical bytes of agent.json for `config` (invalid values are refused)."""
    problems = config.problems()
    if problems:
        raise AgentConfigError(f"invalid agent configuration: {'; '.join(problems)}")
    return canonical_bytes({"schema": CONFIG_SCHEMA, "schema_version": CONFIG_SCHEMA_VERSION, **to_json(config)})


def write_config(root: Path, config: AgentConfig) -> Path:
    """Write `<root>/agent.json` atomically; returns its path."""
    data = config_bytes(config)
    Path(root).mkdir(parents=True, exist_ok=True)
    path = Path(root) / CONFIG_NAME
    write_atomic(path, data)
    return path


def load_config(root: Path) -> AgentConfig:
    """The validated configuration of the agent rooted at `root`, once no other user could have
    changed it (`check_owned_path`)."""
    check_owned_path(Path(root))
    path = Path(root) / CONFIG_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise AgentConfigError(
            f"{path}: missing; the operator's `edgetune rollout` writes it (wrong --root?)"
        ) from None
    except OSError as err:
        raise AgentConfigError(f"{path}: cannot be read ({err.strerror})") from None
    config = load_versioned(
        AgentConfig, data, str(path), CONFIG_SCHEMA, CONFIG_SCHEMA_VERSION, error=AgentConfigError, reader="this agent"
    )
    problems = config.problems()
    if problems:
        raise AgentConfigError(f"{path}: {'; '.join(problems)}")
    return config


def check_owned_path(root: Path) -> None:
    """Refuse (AgentConfigError, naming it) an agent root that another user could change: the
    root or a parent up to `/` owned by someone other than root or this user, or writable by
    group or others without the sticky bit (as /tmp has). agent.json names a command the agent
    runs, and its keys decide what it trusts."""
    me = os.geteuid()
    for directory in (root.resolve(), *root.resolve().parents):
        try:
            info = directory.stat()
        except FileNotFoundError:
            continue  # the root itself before its first rollout
        if info.st_uid not in (0, me):
            raise AgentConfigError(
                f"{directory} belongs to uid {info.st_uid}, another user, who could change what this "
                f"agent trusts and runs ({root}); give it to root or to this user (uid {me})"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            raise AgentConfigError(
                f"{directory} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}), who "
                f"could change what this agent trusts and runs ({root}); run chmod go-w {directory}"
            )


def read_token(root: Path, config: AgentConfig) -> str:
    """The board's bearer token; refused if others may read it or it is too short to be secret."""
    path = config.path_of(root, config.token_file)
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise AgentConfigError(f"cannot read the board token {path} ({CONFIG_NAME} token_file): {err}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AgentConfigError(f"the board token {path} is readable by others: chmod 600 {path}")
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise AgentConfigError(
            f"the board token {path} is not a token (at least {MIN_TOKEN_CHARS} characters, no spaces)"
        )
    return token


def load_pinned_key(root: Path, config: AgentConfig) -> Ed25519PublicKey:
    """The fleet's public key pinned on the board: the only key whose signatures are accepted."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    path = config.path_of(root, config.public_key)
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as err:
        raise AgentConfigError(
            f"the pinned fleet key {path} ({CONFIG_NAME} public_key) cannot be used: {err}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise AgentConfigError(f"the pinned fleet key {path} ({CONFIG_NAME} public_key) is not an ed25519 public key")
    return key


def load_server_tls(root: Path, config: AgentConfig) -> ssl.SSLContext | None:
    """For an https:// server: a TLS context trusting only the pinned fleet CA, the host name
    checked; None for http://."""
    import ssl

    if config.server_ca is None:
        return None
    path = config.path_of(root, config.server_ca)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=str(path))
    except (OSError, ssl.SSLError) as err:
        raise AgentConfigError(
            f"the pinned fleet CA {path} ({CONFIG_NAME} server_ca) cannot be used: {err}; have the operator roll out again"
        ) from None
    return context
