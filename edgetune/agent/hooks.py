"""A model's hooks: the commands the agent runs around a switch of its `current` link.

fleet.yaml's `models[].on_switch` and `models[].health` reach the board in agent.json
(`AgentConfig.hooks`). Each command runs with `/bin/sh -c`, as the agent's user, in the agent's
root, with stdin closed, in a process group of its own, and with the agent's environment (with
`TVM_USE_RUNTIME_LIB=1` unless the board set it: `__main__.py`) plus:

    EDGETUNE_HOOK              on_switch | health
    EDGETUNE_MODEL             the model
    EDGETUNE_VERSION           the version `current` now points to ("" when none is active)
    EDGETUNE_PREVIOUS_VERSION  the version it pointed to before this switch ("" when none)
    EDGETUNE_RELEASE           the release directory of EDGETUNE_VERSION ("" when none)
    EDGETUNE_BOARD             this board's name

Its stdout and stderr go to one file; the last `OUTPUT_LINES` lines (at most `OUTPUT_CHARS`
characters) are kept in the run's record (`HookRun`). A command that does not exit within its
time (`on_switch`: `ON_SWITCH_TIMEOUT_S`; `health`: its `timeout_s`) has its process group
killed; so has one stopped by the agent's guard (its deadline passed, or its channel closed).
Processes a command leaves behind after it exited (an application it restarted) are left alone.
The agent waits for the command's exit, not for the end of its output.

install.py decides what the results mean: see `_Change.switch`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgetune.agent.guard import ChangeStopped
from edgetune.artifact_format.codec import rule

ON_SWITCH_TIMEOUT_S = 30.0
OUTPUT_LINES = 20
OUTPUT_CHARS = 4000
_TAIL_BYTES = 64 * 1024  # read from the end of the output file: enough for OUTPUT_LINES long lines
HOOKS = ("on_switch", "health")
OUTCOMES = ("passed", "failed", "timed_out", "stopped")


@dataclass(frozen=True)
class HookRun:
    """One run of a hook: in the install's or rollback's record, and (health) in state.json."""

    hook: str = rule(allowed=HOOKS)
    command: str
    version: int | None  # the version switched to when it ran (EDGETUNE_VERSION; None: none active)
    started: str  # UTC ISO 8601
    timeout_s: float  # the time it had
    seconds: float  # how long it ran
    outcome: str = rule(
        allowed=OUTCOMES
    )  # passed (exit 0) | failed (another exit, or killed by a signal) | timed_out |
    # stopped (by the agent's guard: its deadline passed, or its channel closed)
    exit_status: int | None  # its exit status (negative: the signal that killed it); None: it did not exit by itself
    output: str  # its last lines of stdout and stderr

    @property
    def ok(self) -> bool:
        return self.outcome == "passed"

    def summary(self) -> str:
        """`/opt/app/check` exited 3, `...` did not exit within 30 s, ..."""
        what = {
            "passed": "exited 0",
            "failed": f"exited {self.exit_status}" if (self.exit_status or 0) >= 0 else _killed_by(self.exit_status),
            "timed_out": f"did not exit within {self.timeout_s:g} s (killed)",
            "stopped": "was stopped (killed)",
        }[self.outcome]
        return f"`{_short(self.command)}` {what}"

    def described(self) -> str:
        """The summary, then its output's last lines, if any."""
        output = self.output.rstrip()
        return f"{self.summary()}; its output (last lines):\n{output}" if output else f"{self.summary()}; no output"


def hook_env(
    board: str, model: str, version: int | None, previous: int | None, release: Path | None, hook: str
) -> dict[str, str]:
    """The environment of a hook: the agent's, and the EDGETUNE_* variables above."""
    return {
        **os.environ,
        "EDGETUNE_HOOK": hook,
        "EDGETUNE_MODEL": model,
        "EDGETUNE_VERSION": "" if version is None else str(version),
        "EDGETUNE_PREVIOUS_VERSION": "" if previous is None else str(previous),
        "EDGETUNE_RELEASE": "" if release is None else str(release),
        "EDGETUNE_BOARD": board,
    }


def run_hook(hook: str, command: str, version: int | None, env: dict[str, str], cwd: Path, timeout_s: float) -> HookRun:
    """Run `command` (see the module docstring) and say how it went. A stop by the agent's guard
    (`ChangeStopped`) while it runs kills its process group and is its outcome `stopped`; any
    other interruption kills the group too and is raised."""
    started, began = _utc_now(), time.monotonic()
    exit_status, outcome = None, "failed"
    with tempfile.TemporaryFile() as output:
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except OSError as err:
            return HookRun(hook, command, version, started, timeout_s, 0.0, "failed", None, f"cannot be started: {err}")
        try:
            exit_status = process.wait(timeout=timeout_s)
            outcome = "passed" if exit_status == 0 else "failed"
        except subprocess.TimeoutExpired:
            outcome = "timed_out"
            _kill_group(process)
        except ChangeStopped as err:
            outcome = "stopped"
            _kill_group(process)
            output.write(f"\n[edgetune agent: {err}]\n".encode())
        except BaseException:
            _kill_group(process)
            raise
        seconds = time.monotonic() - began
        return HookRun(
            hook, command, version, started, timeout_s, round(seconds, 3), outcome, exit_status, _tail(output)
        )


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _tail(output) -> str:
    """The last OUTPUT_LINES lines (at most OUTPUT_CHARS characters) written to `output`."""
    output.flush()
    size = output.seek(0, os.SEEK_END)
    output.seek(max(0, size - _TAIL_BYTES))
    text = output.read().decode("utf-8", errors="replace")
    lines = text.splitlines()[-OUTPUT_LINES:]
    return "\n".join(lines)[-OUTPUT_CHARS:]


def _killed_by(status: int | None) -> str:
    try:
        return f"was killed by {signal.Signals(-(status or 0)).name}"
    except ValueError:
        return f"was killed by signal {-(status or 0)}"


def _short(command: str) -> str:
    """The command's first line, at most 200 characters ("..." when more)."""
    first = command.strip().split("\n", 1)[0]
    return first[:200] + (" ..." if len(first) > 200 or "\n" in command.strip() else "")


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
