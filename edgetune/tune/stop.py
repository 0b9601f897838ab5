"""Stopping a tuning run from outside (Ctrl-C, SIGTERM): it ends after the rounds in flight, as
`tuning.time_limit_s` ends it, with every measured trial, the cost model and the reports
written, so a re-run resumes. A second signal stops at once.

Why a request and not an exception: each class tunes in a process of its own, inside
MetaSchedule's C++ loop. A Python handler that raised there would fire only inside one of
edgetune's callbacks, where TVM's FFI turns the exception into a C++ error or a dropped
candidate, and the loop would go on (edgetune.tvm_compat.python_callbacks). So the CLI's handler
(`stop_on_signals`) only sets an event the class processes share (`adopt` in each), and the
budget scheduler reads it before it starts a round (`stop_requested`). Outside tuning the
same handler stops at once, as Ctrl-C always did.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPED = "stopped on request (SIGINT or SIGTERM): every measured trial is kept; re-run to resume"

_event = None  # the multiprocessing Event shared with the class processes
_tuning = 0  # how many tuning runs this process is waiting on
_lock = threading.Lock()


def stop_event():
    """The event a stop request sets; give it to each class process (`adopt`)."""
    global _event
    with _lock:
        if _event is None:
            _event = multiprocessing.get_context("spawn").Event()
        return _event


def adopt(event) -> None:
    """In a class process: follow `event`, and leave Ctrl-C (sent to the whole terminal process
    group) to the parent, which turns it into a request."""
    global _event
    _event = event
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_requested() -> str | None:
    """Why tuning must stop, or None."""
    return STOPPED if _event is not None and _event.is_set() else None


def request_stop() -> None:
    stop_event().set()


@contextmanager
def tuning() -> Iterator[None]:
    """While inside, a signal caught by `stop_on_signals` asks for a stop instead of stopping."""
    global _tuning
    stop_event()
    with _lock:
        _tuning += 1
    try:
        yield
    finally:
        with _lock:
            _tuning -= 1


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM, in this (main) thread: during tuning the first asks for a stop after
    the rounds in flight, and any other raises KeyboardInterrupt. Restores the old handlers and
    forgets the request on the way out."""
    global _event

    def handler(signum: int, _frame) -> None:
        if _tuning and stop_requested() is None:
            request_stop()
            log.warning(
                "%s: tuning stops after the rounds in flight and keeps them; send it again to stop at once",
                signal.Signals(signum).name,
            )
            return
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        with _lock:
            _event = None
