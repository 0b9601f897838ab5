"""Logs that stay small under attack. `RepeatFilter` lets the first warning (or error) of a kind
through and only counts the same kind again within `window_s`; when the window is over, the
count is logged as one line, "N more like this in the last T s: <the first one's text>", and the
next of that kind is logged in full again. A kind is the logger, the level and the first line of
the message's template (asyncio's "socket.accept() out of system resource", the guard's "refused
a connection from %s ..."), so the same event from many clients is one kind.

`limit_repeats()` puts one filter on the loggers an unauthenticated client can make speak once
per connection or request: asyncio's (accept errors such as EMFILE, failed TLS), uvicorn's
(invalid requests, errors of the application) and the connection guard's (refusals and cuts).
The access log (`edgetune.access`, one line per answered request) is not limited.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

WINDOW_S = 60.0
MAX_KINDS = 1000  # kinds tracked at once; beyond, a new kind is logged as it comes
LIMITED_LOGGERS = ("asyncio", "uvicorn.error", "edgetune.deploy.connections")
_SUMMARY = "%d more like this in the last %.0f s: %s"


@dataclass
class _Window:
    started: float
    first: logging.LogRecord
    repeats: int = 0


class RepeatFilter(logging.Filter):
    """Repeats of a kind of warning within `window_s` are counted, then logged as one summary."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.window_s = window_s
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "repeat_summary", False):
            return True
        key = (record.name, record.levelno, str(record.msg).partition("\n")[0][:200])
        now = time.monotonic()
        with self._lock:
            due = self._take_due(now)
            window = self._windows.get(key)
            if window is None:
                if len(self._windows) < MAX_KINDS:
                    self._windows[key] = _Window(now, record)
                passed = True
            else:
                window.repeats += 1
                passed = False
                self._schedule(now)
        _log_summaries(due, now)
        return passed

    def flush_due(self) -> None:
        """Log the summaries of the windows that are over (the timer calls this)."""
        now = time.monotonic()
        with self._lock:
            self._timer = None
            due = self._take_due(now)
            if any(w.repeats for w in self._windows.values()):
                self._schedule(now)
        _log_summaries(due, now)

    def _take_due(self, now: float) -> list[_Window]:
        over = [key for key, w in self._windows.items() if now - w.started >= self.window_s]
        return [w for w in (self._windows.pop(key) for key in over) if w.repeats]

    def _schedule(self, now: float) -> None:
        if self._timer is None:
            first_end = min(w.started for w in self._windows.values() if w.repeats) + self.window_s
            self._timer = threading.Timer(max(0.0, first_end - now) + 0.01, self.flush_due)
            self._timer.daemon = True
            self._timer.start()


def _log_summaries(windows: list[_Window], now: float) -> None:
    for window in windows:
        first = window.first
        text = first.getMessage().partition("\n")[0][:300]
        summary = logging.LogRecord(
            first.name,
            first.levelno,
            first.pathname,
            first.lineno,
            _SUMMARY,
            (window.repeats, now - window.started, text),
            None,
        )
        summary.repeat_summary = True
        logging.getLogger(first.name).handle(summary)


_FILTER = RepeatFilter()


def limit_repeats() -> RepeatFilter:
    """The process's one `RepeatFilter`, on each of `LIMITED_LOGGERS` (once)."""
    for name in LIMITED_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    return _FILTER
