"""A MetaSchedule JSON database file made loadable after a crash.

TVM 0.27's JSONDatabase appends each line with one write, so a crash (SIGKILL, power loss) can
leave the last line torn, which TVM refuses to load; and it dies with SIGSEGV (exit 139)
loading a file with an empty or whitespace-only line. No upstream issue found.
`repair_lines` drops both before TVM reads the file. Test: tests/tvm_compat/test_database_lines.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgetune.durable import write_atomic


def repair_lines(path: Path) -> int:
    """Make a database file loadable by TVM: drop blank lines and a last line that a crash left
    incomplete (a complete last line that only lacks its newline gets one: TVM would join the
    next record onto it). Returns the number of bytes dropped. The file is replaced atomically;
    the caller makes sure no other process is writing it."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    *lines, tail = data.split(b"\n")
    kept = [line for line in lines if line.strip()]
    tail_complete = bool(tail.strip()) and parses_as_json(tail)
    repaired = b"".join(line + b"\n" for line in kept + ([tail] if tail_complete else []))
    if repaired != data:
        write_atomic(path, repaired)
    blank = sum(len(line) + 1 for line in lines if not line.strip())
    return blank + (0 if tail_complete else len(tail))


def parses_as_json(line: bytes) -> bool:
    """Whether `line` is one whole JSON value (a line cut short by a crash is not)."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
