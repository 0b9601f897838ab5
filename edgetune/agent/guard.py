"""When a changing run (install, rollback) must stop before it switches `current`.

A rollout gives each run it starts a deadline shorter than its own timeout (`--deadline-s`)
and asks it to watch the SSH channel it came on (`--abort-on-hangup`): the run's stdin is that
channel, so end-of-file there (or a SIGHUP) means the host that started it is gone, killed or
cut off. Either stops the run at once, whatever it is doing (a download; the reference check,
whose child process is then killed): `ChangeStopped` is raised in the main thread, the run
cleans up like after any failure, and the board stays on the release it had. Only `commit()`,
called right before the switch, ends this: from there the run completes (a few renames). So a
run that outlived the rollout that started it never switches behind its back.

A model with hooks (hooks.py) runs them after the switch: `reopen()` arms the guard again
for that time, so that a stop while they run (or one that came since the commit) raises
`ChangeStopped` there too, and the install switches the board back before it answers
(install.py); `commit()` again ends that. So the deadline covers the hooks as well: once it has
passed, the board is not left on a release whose health check did not pass.

The deadline is a SIGALRM timer; the watch, a thread reading stdin to its end that then sends
SIGHUP to the main thread. Both need the main thread (the agent's command line runs there).
"""

from __future__ import annotations

import os
import signal
import threading

from edgetune.agent.errors import AgentConfigError, AgentError

_SIGNALS = (signal.SIGALRM, signal.SIGHUP)


class ChangeStopped(AgentError):
    """The run was stopped before the switch: its deadline passed or its channel closed."""


class SwitchGuard:
    """A context manager around one changing run; the default one never stops anything."""

    def __init__(self, deadline_s: float | None = None, abort_on_hangup: bool = False):
        if deadline_s is not None and not deadline_s > 0:
            raise AgentConfigError(f"--deadline-s must be a positive number of seconds, got {deadline_s}")
        self.deadline_s, self.abort_on_hangup = deadline_s, abort_on_hangup
        self._armed = False
        self._after_switch = False  # reopened: the stop's message says the board goes back
        self._deadline_passed = self._channel_closed = False  # seen while disarmed too
        self._previous: dict[signal.Signals, object] = {}

    @property
    def active(self) -> bool:
        return self.deadline_s is not None or self.abort_on_hangup

    def __enter__(self) -> SwitchGuard:
        if not self.active:
            return self
        self._previous = {signum: signal.signal(signum, self._stop) for signum in _SIGNALS}
        self._armed = True
        if self.deadline_s is not None:
            signal.setitimer(signal.ITIMER_REAL, self.deadline_s)
        if self.abort_on_hangup:
            threading.Thread(target=self._watch_channel, args=(threading.main_thread().ident,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        self._armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in self._previous.items():
            # the watch may still send its SIGHUP when the channel closes after the run: ignored
            keep_ignoring = signum == signal.SIGHUP and self.abort_on_hangup
            signal.signal(signum, signal.SIG_IGN if keep_ignoring else handler)

    def commit(self) -> None:
        """The switch comes next (or, reopened, the hooks passed): from here on the run completes."""
        self._armed = False

    def reopen(self) -> None:
        """The switch is done and the hooks run next: until `commit()`, a stop raises
        ChangeStopped (then the run switches back); one that came since the commit raises now."""
        if not self.active:
            return
        self._after_switch = self._armed = True
        if self._deadline_passed or self._channel_closed:
            self._stop(signal.SIGALRM if self._deadline_passed else signal.SIGHUP, None)

    def _stop(self, signum: int, frame) -> None:
        if signum == signal.SIGALRM:
            self._deadline_passed = True
        else:
            self._channel_closed = True
        if not self._armed:
            return
        self._armed = False  # one stop: the clean-up that follows is not interrupted again
        if self._after_switch:
            if signum == signal.SIGALRM:
                raise ChangeStopped(
                    f"its deadline ({self.deadline_s:g} s, set by the rollout) passed while the hooks of the switch ran"
                )
            raise ChangeStopped(
                "the SSH channel that started it closed while the hooks of the switch ran (the host "
                "or the network went away)"
            )
        if signum == signal.SIGALRM:
            raise ChangeStopped(
                f"its deadline ({self.deadline_s:g} s, set by the rollout) passed before the switch; "
                "stopped, nothing switched: roll out again with a longer --timeout-s"
            )
        raise ChangeStopped(
            "the SSH channel that started it closed before the switch (the host or the network "
            "went away); stopped, nothing switched: roll out again"
        )

    def _watch_channel(self, main_thread: int) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # the timer's signal goes to the main thread
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass  # a closed or broken stdin is a closed channel too
        self._channel_closed = True  # before reading _armed: `reopen` sets _armed before reading this
        if self._armed:
            signal.pthread_kill(main_thread, signal.SIGHUP)
