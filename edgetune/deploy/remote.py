"""The board agent driven over SSH: provision it on a board, then run its verbs.

Before its first verb on a board, the agent's bundle is delivered where its copy is missing or
differs (`fleet.agent_bundle`: the board needs nothing of edgetune installed). Provisioning
writes `<board workdir>/agent/`: `agent.json` (the board's name, class, the server URL, releases
to keep, its firmware command, the models' hooks), `fleet.pub` (the fleet's anchor key, its first artifact key: the
root of every key the agent trusts; a different pinned key is never replaced),
`trust-offered.json` (the fleet's trust file, `deploy.keys`: the agent takes it if it extends
the history it took), `fleet-ca.pem` (the fleet CA, the only authority the agent trusts for an
https:// server; replaced only where the board pins a CA the fleet had before) and `token`
(mode 0600). Each verb runs the hash-checked bundle with the board's Python
(`... --root ROOT VERB ... --json`); its answer, a versioned record (`agent.answer`), is decoded
here into the agent's own record of the verb, and a failure to reach the board raised. On a
board of the SSH transport a verb that downloads reaches the server through a forward of this
very SSH connection (the agent's TLS checks unchanged).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import urlsplit

import paramiko

from edgetune.agent.answer import AgentAnswer, answer_record, last_json_object, read_answer
from edgetune.agent.client import SERVER_VIA_ENV
from edgetune.agent.config import AgentConfig, HealthCheck, ModelHooks, config_bytes
from edgetune.agent.fetch import SerialReset
from edgetune.agent.install import ChangeRecord
from edgetune.agent.run_report import RunReport
from edgetune.agent.status import InstallationStatus
from edgetune.artifact_format.signing import key_id, public_key_id
from edgetune.artifact_format.trust import anchor_pem, artifact_history
from edgetune.deploy.keys import KeyFiles, read_trust
from edgetune.deploy.tls import is_fleet_ca
from edgetune.errors import DeployError
from edgetune.fleet.agent_bundle import agent_argv, agent_root, ensure_bundle
from edgetune.fleet.forward import RemoteForward
from edgetune.fleet.on_board import firmware_command
from edgetune.fleet.ssh import BoardSession, tail
from edgetune.fleet.ssh_route import uses_ssh_transport
from edgetune.inventory.schema import Board, Fleet

PUBLIC_KEY_NAME = "fleet.pub"
OFFERED_TRUST_NAME = "trust-offered.json"
CA_NAME = "fleet-ca.pem"
TOKEN_NAME = "token"
T = TypeVar("T")
SERVER_VERBS = ("fetch", "install")  # the agent's verbs that download from the artifact server


def server_address(url: str) -> tuple[str, int]:
    """Where this host reaches the artifact server: the host and port of its URL."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def agent_config(fleet: Fleet, board: Board) -> AgentConfig:
    profile = fleet.device_class(board.device_class).profile
    return AgentConfig(
        board=board.name,
        device_class=board.device_class,
        server=fleet.deploy.url,
        token_file=TOKEN_NAME,
        public_key=PUBLIC_KEY_NAME,
        server_ca=CA_NAME if fleet.deploy.tls else None,
        keep_releases=fleet.deploy.keep_releases,
        firmware_command=firmware_command(fleet, board),
        threads=board.threads or profile.runtime_threads,
        hooks=model_hooks(fleet),
    )


def model_hooks(fleet: Fleet) -> dict[str, ModelHooks] | None:
    """The models' `on_switch` and `health` (fleet.yaml) as agent.json carries them; None (not
    written) when no model has any."""
    hooks = {
        model.name: ModelHooks(
            on_switch=model.on_switch,
            health=HealthCheck(model.health.command, model.health.timeout_s) if model.health else None,
        )
        for model in fleet.models
        if model.on_switch is not None or model.health is not None
    }
    return hooks or None


class UnreadableAnswer(DeployError):
    """An agent's answer that is not what this edgetune's agent answers: nothing is taken from it."""

    def __init__(self, problem: str):
        super().__init__(
            f"{problem[:1000]}; nothing is taken from it. Every verb runs this host's agent bundle, checked by its hash "
            "on the board and sent again where the board's copy differs, so the board's python (`python:` in "
            "fleet.yaml) ran another program: make it the board's plain Python, then run the command again"
        )


class RemoteAgent:
    """The agent of one board, over one SSH session."""

    def __init__(self, session: BoardSession, fleet: Fleet):
        self.session, self.fleet, self.board = session, fleet, session.board
        self.root = agent_root(self.board)
        self._bundle_checked = False

    def provision(self, token: str, public_key_pem: bytes) -> None:
        """Write the agent's config, anchor key, trust file, CA and token (idempotent).
        `public_key_pem`: the artifact key's public half, which must be the trust file's newest."""
        files = KeyFiles.of(self.fleet)
        trust = read_trust(files.trust)
        newest = key_id(artifact_history(trust)[-1])
        if public_key_id(public_key_pem) != newest:
            raise DeployError(
                f"{files.public_key} is not the newest artifact key of {files.trust} ({newest}): the keys "
                "directory mixes two fleets' files, or a rotation was not finished (run it again)"
            )
        self._pin(PUBLIC_KEY_NAME, anchor_pem(trust), "fleet anchor key", lambda pinned: False)
        self.session.put_file(f"{self.root}/{OFFERED_TRUST_NAME}", trust.to_bytes(), mode=0o644)
        if self.fleet.deploy.tls:
            self._pin(
                CA_NAME,
                self.fleet.deploy.tls.ca_cert.read_bytes(),
                "fleet CA",
                lambda pinned: is_fleet_ca(self.fleet, pinned),
            )
        self.session.put_file(f"{self.root}/{TOKEN_NAME}", token.encode("ascii"), mode=0o600)
        self.session.put_file(f"{self.root}/agent.json", config_bytes(agent_config(self.fleet, self.board)), mode=0o644)

    def _pin(self, name: str, pem: bytes, what: str, replaceable: Callable[[bytes], bool]) -> None:
        """Write `pem` as the board's pinned `name`, unless it pins another one that is not
        `replaceable` (an earlier one of this fleet)."""
        pinned = self.session.run(f"cat {shlex.quote(self.root)}/{name}", check=False)
        other = pinned.exit_status == 0 and pinned.stdout.strip() != pem.decode().strip()
        if other and not replaceable(pinned.stdout.encode()):
            raise DeployError(
                f"{self.board.name}: the agent pins a {what} this fleet never had ({self.root}/{name}): the board "
                "belongs to another fleet; if it really is this fleet's, remove that file on the board, then roll out again"
            )
        self.session.put_file(f"{self.root}/{name}", pem, mode=0o644)

    @contextmanager
    def _server_route(self, verb: str) -> Iterator[str]:
        """For a verb that downloads, on a board of the SSH transport: a forward from the board's
        loopback to the artifact server, for as long as the verb runs, and the environment
        that sends the agent's connections there ("" otherwise)."""
        if verb not in SERVER_VERBS or not uses_ssh_transport(self.board):
            yield ""
            return
        transport = self.session.connect().get_transport()
        try:
            forward = RemoteForward(transport, 0, server_address(self.fleet.deploy.url))
        except (paramiko.SSHException, OSError, EOFError) as err:
            raise DeployError(
                f"{self.board.name}: the board's sshd refused a forward to the artifact server "
                f"(AllowTcpForwarding no?): {err}"
            ) from None
        try:
            yield f"{SERVER_VIA_ENV}=127.0.0.1:{forward.port} "
        finally:
            forward.close()

    def status(self) -> InstallationStatus:
        """The agent's `status`, decoded: a wrong type anywhere is this board's DeployError."""
        return self._decoded(InstallationStatus, "status")

    def run(self, model: str, *args: str) -> RunReport:
        """The agent's `run` of the model's current release, its report decoded (outputs checked
        against the expected output, timing samples)."""
        return self._decoded(RunReport, "run", "--model", model, *args)

    def reset_serial(self, serial: int) -> SerialReset:
        """The agent's `reset-serial --to serial`, its record decoded."""
        return self._decoded(SerialReset, "reset-serial", "--to", str(serial))

    def change(self, verb: str, *args: str, timeout_s: float | None = None) -> ChangeRecord:
        """An `install` or `rollback`, its record decoded (an answer that does not decode raises,
        as a lost one does: what the board runs must then be read back)."""
        return self._decoded(ChangeRecord, verb, *args, timeout_s=timeout_s)

    def answer(self, verb: str, *args: str, timeout_s: float | None = None) -> AgentAnswer:
        """Run one agent verb (its bundle delivered first, once per session); its answer, whose
        schema, version and verb are checked. Every verb runs through here."""
        if not self._bundle_checked:
            ensure_bundle(self.session)
            self._bundle_checked = True
        argv = agent_argv(self.board, "--root", self.root, verb, *args, "--json")
        with self._server_route(verb) as env:
            result = self.session.run(env + shlex.join(argv), check=False, timeout=timeout_s)
        line = last_json_object(result.stdout)
        if line is None:
            raise DeployError(
                f"{self.board.name}: the agent gave no answer to `{verb}` (exit {result.exit_status}):\n"
                f"{tail(result.stderr)}"
            )
        return answer_of(self.board.name, verb, line)

    def call(self, verb: str, *args: str, timeout_s: float | None = None) -> dict:
        """Run one agent verb; its record as plain data, or `{"error": ...}` when the verb failed
        on the board (the answer's version and verb checked, its record not decoded)."""
        answer = self.answer(verb, *args, timeout_s=timeout_s)
        return dict(answer.record or {}) if answer.error is None else {"error": answer.error}

    def _decoded(self, cls: type[T], verb: str, *args: str, timeout_s: float | None = None) -> T:
        return record_of(cls, self.board.name, verb, self.answer(verb, *args, timeout_s=timeout_s))


def answer_of(board: str, verb: str, line: str) -> AgentAnswer:
    """`line`, the last JSON object the agent of `board` printed, as its answer to `verb`."""
    return read_answer(line, verb, _where(board, verb), UnreadableAnswer)


def record_of(cls: type[T], board: str, verb: str, answer: AgentAnswer) -> T:
    """The verb's record in `answer`, as `cls`; the verb's failure on the board is a DeployError."""
    if answer.error is not None:
        raise DeployError(f"{board}: the agent's `{verb}` failed: {answer.error[:2000]}")
    return answer_record(cls, answer, _where(board, verb), UnreadableAnswer)


def _where(board: str, verb: str) -> str:
    return f"{board}: the agent's answer to `{verb}`"
