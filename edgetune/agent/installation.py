"""One agent installation on a board: its root, configuration, trusted keys, server and firmware."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from edgetune.agent.config import AgentConfig, load_config, load_pinned_key, load_server_tls, read_token
from edgetune.agent.errors import AgentError
from edgetune.agent.file_tree import FileTree
from edgetune.agent.state import ModelState, load_state, reconcile, save_state
from edgetune.durable import write_atomic

if TYPE_CHECKING:  # imported where used: `status` needs neither the server nor the keys
    from edgetune.agent.client import ArtifactServer
    from edgetune.artifact_format.trust import Trusted, TrustFile

FIRMWARE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Installation:
    tree: FileTree
    config: AgentConfig

    @classmethod
    def open(cls, root: Path) -> Installation:
        return cls(FileTree(root), load_config(root))

    @property
    def root(self) -> Path:
        return self.tree.root

    def trusted(self, offered: TrustFile | None = None, now: float | None = None, take_offered: bool = True) -> Trusted:
        """The keys this board trusts: its pinned anchor, followed through the trust file it took
        before, after taking the one the rollout left (once) and the server's `offered` one when
        they are newer (`artifact_format.trust.accept_trust`); one it must not take is an
        AgentError. `take_offered=False` (an application's check): only what was taken counts."""
        from edgetune.artifact_format.trust import Trusted, TrustError, accept_trust

        now = time.time() if now is None else now
        anchor = load_pinned_key(self.root, self.config)
        accepted = _read_trust(self.tree.trust)
        pushed = None
        if take_offered:
            pushed = _read_trust(self.tree.offered_trust)
            self.tree.offered_trust.unlink(missing_ok=True)
        for where, candidate in ((self.tree.offered_trust, pushed), ("the server's trust file", offered)):
            if candidate is None or candidate == accepted:
                continue
            try:
                accept_trust(anchor, candidate, accepted, now)
            except TrustError as err:
                raise AgentError(f"{where}: {err}") from None
            write_atomic(self.tree.trust, candidate.to_bytes())
            accepted = candidate
        if accepted is None:
            return Trusted(anchor, (anchor,), None, None)
        try:
            return accept_trust(anchor, accepted, accepted, now)
        except TrustError as err:
            raise AgentError(f"{self.tree.trust}: {err}") from None

    def server(self) -> ArtifactServer:
        from edgetune.agent.client import SERVER_VIA_ENV, ArtifactServer, parse_via

        via = os.environ.get(SERVER_VIA_ENV)
        return ArtifactServer(
            self.config.server,
            read_token(self.root, self.config),
            tls=load_server_tls(self.root, self.config),
            via=parse_via(via) if via else None,
        )

    @cached_property
    def firmware(self) -> str:
        return firmware_fingerprint(self.config.firmware_command)

    def current_state(self) -> dict[str, ModelState]:
        """The state as it is on disk, completed from the links (nothing written)."""
        return reconcile(self.tree, load_state(self.tree), lambda: self.firmware)

    def recover(self) -> dict[str, ModelState]:
        """With the lock held: remove what killed runs left, and save the completed state."""
        self.tree.remove_leftovers()
        stored = load_state(self.tree)
        state = reconcile(self.tree, stored, lambda: self.firmware)
        if state != stored:
            save_state(self.tree, state)
        return state


def take_trust_file(root: Path, path: Path) -> None:
    """Take the fleet's trust file given by hand (`edgetune pull` writes it beside the tarball
    it pulls) as one from the server would be taken; an AgentError names what is wrong."""
    from edgetune.artifact_format.trust import TrustError, TrustFile

    try:
        offered = TrustFile.from_bytes(path.read_bytes(), str(path))
    except OSError as err:
        raise AgentError(f"{path}: cannot be read ({err.strerror})") from None
    except TrustError as err:
        raise AgentError(str(err)) from None
    Installation.open(root).trusted(offered)


def _read_trust(path: Path) -> TrustFile | None:
    """The trust file at `path`; None if there is none or it is damaged (the anchor then
    roots the history alone)."""
    from edgetune.artifact_format.trust import TrustError, TrustFile

    try:
        return TrustFile.from_bytes(path.read_bytes(), str(path))
    except (OSError, TrustError):
        return None


def firmware_fingerprint(command: str, timeout_s: float = FIRMWARE_TIMEOUT_S) -> str:
    """The output of the firmware command (run by the shell), or `unknown (why)`."""
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"unknown (`{command}` took more than {timeout_s:g} s)"
    except OSError as err:
        return f"unknown (`{command}`: {err.strerror})"
    output = done.stdout.strip()
    if done.returncode != 0 or not output:
        return f"unknown (`{command}` exited {done.returncode}: {done.stderr.strip()[-200:]})"
    return output
