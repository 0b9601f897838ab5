"""The processes the host tunes its classes in: forked from a server process that imported the
tuner once (TVM, MetaSchedule, edgetune's rules and intrinsics), so a run of several classes, and
every later run in the same host process, starts its classes without importing them again.

The server (multiprocessing's "forkserver") forks before any thread or TVM runtime state exists,
which a fork of the host itself could not promise. A child of it would have the server's
environment and standard streams, those of the moment it started; `start_class_process` gives
it the host's as they are when the class starts, as a spawned process has them.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import reduction
from typing import Any

from edgetune.tune.stop import adopt, stop_event

PRELOADED = ["edgetune.tune.tuner"]
_STREAMS = (1, 2)


class _Stream:
    """One of the host's standard streams, passed to the class process as an open descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _inherited_fd, (reduction.DupFd(self.fd),)


def _inherited_fd(duplicate) -> int:
    return duplicate.detach()


def class_process_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of `workers` class processes, forked from the tuner's server process (started on
    first use, with the tuner imported)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    streams = tuple(_Stream(fd) for fd in _STREAMS)
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=start_class_process,
        initargs=(stop_event(), dict(os.environ), streams),
    )


def start_class_process(event: Any, environment: dict[str, str], streams: tuple[Any, ...]) -> None:
    """In a class process: the host's environment and standard streams (each `_Stream` arrives
    here as the number of its copy of the host's descriptor), and its stop event."""
    os.environ.clear()
    os.environ.update(environment)
    for target, fd in zip(_STREAMS, streams, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    adopt(event)
