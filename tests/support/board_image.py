"""A board image's Python for the tests: a venv holding only what a board needs (edgetune's
dependencies without extras: the TVM runtime, numpy, cryptography, psutil, cloudpickle), and
nothing of edgetune nor of the host's venv.

Made once per set of pins under ~/.cache/edgetune (about 20 s from pip's cache, 430 MB), then
reused. `image_without` makes a second Python from it that lacks some of those packages (a
board that is not ready), by linking every other entry of its site-packages.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from edgetune.fleet.on_board import board_requirements

CACHE = Path.home() / ".cache" / "edgetune"
BASE_PYTHON = shutil.which("python3") or "/usr/bin/python3"
_COMPLETE = ".edgetune-board-image-complete"


def board_image() -> Path:
    """The image's venv (its Python is `<venv>/bin/python`), made if it is not cached yet."""
    pins = sorted(pin for pins in board_requirements().values() for pin in pins)
    venv = CACHE / f"board-image-{hashlib.sha256(' '.join(pins).encode()).hexdigest()[:12]}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "board-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / _COMPLETE).exists():
            shutil.rmtree(venv, ignore_errors=True)
            _run([BASE_PYTHON, "-m", "venv", str(venv)])
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *pins])
            (venv / _COMPLETE).touch()
    return venv


def image_without(image: Path, dest: Path, *distributions: str) -> Path:
    """A venv at `dest` with every package of `image` except `distributions` (their modules
    and metadata); returns its Python."""
    _run([BASE_PYTHON, "-m", "venv", "--without-pip", str(dest)])
    (source,) = image.glob("lib/python3*/site-packages")
    (target,) = dest.glob("lib/python3*/site-packages")
    left_out = {d.replace("-", "_").lower() for d in distributions}
    for entry in source.iterdir():
        if entry.name.split("-")[0].lower() not in left_out and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return dest / "bin" / "python"


def runtime_only_image(image: Path, dest: Path) -> Path:
    """A venv at `dest` like `image` but whose TVM has no compiler library (`libtvm_compiler.so`,
    most of the wheel): what a board that only runs releases can do with; TVM then loads its
    runtime alone. Returns its Python."""
    python = image_without(image, dest, "apache_tvm", "tvm")
    (source,) = image.glob("lib/python3*/site-packages")
    (target,) = dest.glob("lib/python3*/site-packages")
    shutil.copytree(
        source / "tvm",
        target / "tvm",
        copy_function=_link_or_copy,
        ignore=lambda _, names: [n for n in names if n.startswith("libtvm_compiler")],
    )
    for metadata in source.glob("apache_tvm-*.dist-info"):
        (target / metadata.name).symlink_to(metadata)
    return python


def _link_or_copy(source: str, dest: str) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another file system
        shutil.copy2(source, dest)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}): {done.stderr[-2000:]}")
