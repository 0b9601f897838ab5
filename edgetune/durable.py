"""Durable writes: a file replaced atomically, a whole tree flushed to disk before it is renamed.

A rename is only as durable as what it renames: the files' data and the directories' entries
must reach the disk first (fsync), and the directory holding the new name after it. Otherwise
a power loss can leave a complete-looking name over empty or missing files.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a temporary name beside `path`, fsync, then rename over `path`."""
    with replaced_atomically(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


@contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` for the block to write the new file to (by any means);
    when the block ends, the file is fsynced and renamed over `path`. If the block or the
    rename fails, the temporary file is removed and `path` is left as it was."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    _fsync(directory, os.O_DIRECTORY)


def _fsync_file(path: Path) -> None:
    _fsync(path, os.O_NOFOLLOW)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under `root` (itself included), children first;
    symbolic links are not followed."""
    for directory, _subdirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                _fsync_file(Path(path))
        fsync_dir(Path(directory))
