"""The warnings TVM's and onnxruntime's C++ code prints during a tuning run go to the class's
log file (`<database>/logs/native.log`), not the console.

Both write straight to file descriptor 2, past Python's logging (edgetune.tvm_compat.native_warnings),
and what they warn about means nothing to a user: MetaSchedule's `Unknown schedule rule
"meta_schedule.pool_max"` for every pooling kernel (it falls back to its default rules, as
meant), onnxruntime's `Removing initializer ...` for every initializer its constant folding
leaves unused. While
`native_warnings_to(path)` is open, descriptor 2 is a pipe: a thread passes every line on to
the console, except those warnings (and the indented lines that continue one), which it
appends to `path`. Their errors, Python's output and everything else reach the console as before.
Leaving the block waits until the router has passed on every line written inside it, not
until the pipe closes: a build or measurement worker started inside keeps the pipe open for as
long as it lives.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from edgetune.tvm_compat.native_warnings import is_tvm_warning

NATIVE_LOG = "native.log"
# `\x1b[0;93m2026-12-02 02:21:30.04 [W:onnxruntime:, graph.cc:5809 ...] ...` (verbose, info, warning)
_ORT_WARNING = re.compile(rb"\[[VIW]:onnxruntime:")
_ROUTER_EXIT_S = 2.0
_DRAINED = b"\x00edgetune: native log drained\n"  # written last in the block: the router has read it all


def _is_native_warning(line: bytes) -> bool:
    return is_tvm_warning(line) or bool(_ORT_WARNING.search(line))


@contextmanager
def native_warnings_to(path: Path) -> Iterator[None]:
    """Inside: TVM's and onnxruntime's warnings on descriptor 2 are appended to `path`, every
    other line goes on to the console. Child processes started inside inherit the pipe."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "ab")  # noqa: SIM115 -- the router closes it
    sys.stderr.flush()
    console = os.dup(2)
    read_end, write_end = os.pipe()
    drained = threading.Event()
    router = threading.Thread(
        target=_route, args=(read_end, os.dup(console), log, drained), name="native-warnings", daemon=True
    )
    router.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.write(2, _DRAINED)
        os.dup2(console, 2)
        os.close(console)
        # A child that outlives the block keeps the pipe open; the router goes on passing its
        # lines along until the last one exits.
        drained.wait(_ROUTER_EXIT_S)


def _route(read_end: int, console: int, log: BinaryIO, drained: threading.Event) -> None:
    with open(read_end, "rb") as pipe, open(console, "wb") as out, log:
        continuing = False
        for line in pipe:
            if line.endswith(_DRAINED):  # after a child's unfinished line, if there was one
                line = line[: -len(_DRAINED)]
                drained.set()
                if not line:
                    continue
            continuing = _is_native_warning(line) or (continuing and line[:1] in (b" ", b"\t"))
            _write(log if continuing else out, line)


def _write(stream: BinaryIO, line: bytes) -> None:
    """A line lost is better than a router stopped: the pipe would fill and block every writer."""
    try:
        stream.write(line)
        stream.flush()
    except OSError:
        pass
