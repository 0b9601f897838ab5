"""`edgetune timer install|remove`: the boards' pull timers, set up over SSH.

A timer runs the board's agent `sync` (agent/sync.py) every period: it installs the versions the
last rollouts assigned the board and reports what the board runs to the server, so a board that
was off during a rollout catches up by itself. Where the board boots with systemd and the login
is root: a `edgetune-sync-<id>.service` and `.timer` pair (`OnUnitActiveSec`, a randomized
delay of a tenth of the period, started at boot). Else, where the board has `crontab`: a line of
the login user's crontab (whole minutes). Else: the agent's own loop (`sync --every S`), started
detached, which does not survive a reboot. The timer runs the board's bundle directly
(`python -I edgetune-agent.pyz`), so rollouts that replace the bundle do not touch it. The
board must reach `deploy.url` by itself (outbound HTTPS), whatever its `ssh.transport`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.tokens import ensure_token
from edgetune.errors import DeployError
from edgetune.fleet.agent_bundle import agent_root, bundle_path
from edgetune.fleet.parallel import MAX_WORKERS, GroupResult, for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.inventory.schema import Board, Fleet

DEFAULT_PERIOD_S = 300.0
MIN_PERIOD_S = 1.0
MAX_PERIOD_S = 86400.0
METHODS = ("systemd", "cron", "loop")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimerPlan:
    """What a board's timer runs, and the names it goes by on the board."""

    board: Board
    period_s: float

    @property
    def unit(self) -> str:
        return "edgetune-sync-" + hashlib.sha256(agent_root(self.board).encode()).hexdigest()[:12]

    @property
    def sync_argv(self) -> list[str]:
        return [self.board.python, "-I", bundle_path(self.board), "--root", agent_root(self.board), "sync", "--json"]

    @property
    def loop_argv(self) -> list[str]:
        return [*self.sync_argv, "--every", f"{self.period_s:g}"]

    def systemd_service(self) -> str:
        return (
            f"[Unit]\nDescription=edgetune pull: install the versions assigned to {self.board.name}\n"
            "Wants=network-online.target\nAfter=network-online.target\n\n"
            f"[Service]\nType=oneshot\nExecStart={shlex.join(self.sync_argv)}\n"
        )

    def systemd_timer(self) -> str:
        return (
            f"[Unit]\nDescription=edgetune pull timer of {self.board.name}\n\n"
            f"[Timer]\nOnBootSec=60\nOnUnitActiveSec={self.period_s:g}s\n"
            f"RandomizedDelaySec={max(1, math.ceil(self.period_s / 10))}s\n\n"
            "[Install]\nWantedBy=timers.target\n"
        )

    def cron_line(self) -> str:
        minutes = min(59, max(1, round(self.period_s / 60)))
        return f"*/{minutes} * * * * {shlex.join(self.sync_argv)} >/dev/null 2>&1 # {self.unit}"

    def install_script(self) -> str:
        """The board's side of `timer install`: the first method the board has; prints it."""
        root, unit, units = shlex.quote(agent_root(self.board)), self.unit, "/etc/systemd/system"
        return "\n".join(
            [
                self.remove_script(),
                'if [ -d /run/systemd/system ] && [ "$(id -u)" = 0 ] && command -v systemctl >/dev/null; then',
                f"  printf %s {shlex.quote(self.systemd_service())} > {units}/{unit}.service",
                f"  printf %s {shlex.quote(self.systemd_timer())} > {units}/{unit}.timer",
                f"  systemctl daemon-reload && systemctl enable --now {unit}.timer >/dev/null && echo systemd",
                "elif command -v crontab >/dev/null; then",
                f"  {{ crontab -l 2>/dev/null | grep -v '# {unit}$'; echo {shlex.quote(self.cron_line())}; }} | crontab - && echo cron",
                "else",
                f"  cd {root}; setsid nohup {shlex.join(self.loop_argv)} > {root}/sync.log 2>&1 < /dev/null & echo $! > {root}/sync-loop.pid",
                "  echo loop",
                "fi",
            ]
        )

    def remove_script(self) -> str:
        """Stop and remove whichever of the three this board has (none: nothing to do)."""
        root, unit, units = shlex.quote(agent_root(self.board)), self.unit, "/etc/systemd/system"
        return "\n".join(
            [
                f"if [ -f {units}/{unit}.timer ]; then systemctl disable --now {unit}.timer >/dev/null 2>&1; "
                f"rm -f {units}/{unit}.timer {units}/{unit}.service; systemctl daemon-reload; fi",
                f"if command -v crontab >/dev/null && crontab -l 2>/dev/null | grep -q '# {unit}$'; then "
                f"crontab -l | grep -v '# {unit}$' | crontab -; fi",
                f'if [ -f {root}/sync-loop.pid ]; then kill -- -"$(cat {root}/sync-loop.pid)" 2>/dev/null; rm -f {root}/sync-loop.pid; fi',
            ]
        )


def check_period(period_s: float) -> float:
    if (
        isinstance(period_s, bool)
        or not isinstance(period_s, (int, float))
        or not MIN_PERIOD_S <= period_s <= MAX_PERIOD_S
    ):
        raise DeployError(
            f"--every must be a number of seconds from {MIN_PERIOD_S:g} to {MAX_PERIOD_S:g}, got {period_s!r}"
        )
    return float(period_s)


def install_timers(fleet: Fleet, boards: Sequence[Board], period_s: float = DEFAULT_PERIOD_S) -> GroupResult[str]:
    """Provision each board's agent (as a rollout does) and install its timer; per board, the
    method used."""
    if fleet.deploy is None:
        raise DeployError(f"{fleet.path} has no 'deploy' section (bind, url): a pull timer needs a server to pull from")
    period_s = check_period(period_s)
    public_key = fleet.artifacts.public_key.read_bytes()

    def install(board: Board) -> str:
        with BoardSession(board) as session:
            agent = RemoteAgent(session, fleet)
            agent.provision(ensure_token(fleet, board), public_key)
            agent.status()  # delivers the bundle, and proves the agent runs and answers
            method = session.run(TimerPlan(board, period_s).install_script()).stdout.strip().splitlines()[-1:]
        if method and method[0] in METHODS:
            return method[0]
        raise DeployError(f"{board.name}: installing its timer printed no method ({method})")

    return for_each_board(boards, install, fleet.deploy.parallel_for(len(boards)))


def remove_timers(fleet: Fleet, boards: Sequence[Board]) -> GroupResult[None]:
    def remove(board: Board) -> None:
        with BoardSession(board) as session:
            session.run(TimerPlan(board, DEFAULT_PERIOD_S).remove_script())

    return for_each_board(boards, remove, fleet.deploy.parallel_for(len(boards)) if fleet.deploy else MAX_WORKERS)
