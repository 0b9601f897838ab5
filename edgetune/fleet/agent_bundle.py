"""The board agent as one self-contained bundle, and its delivery to a board over SSH.

A board has Python, numpy, cryptography and the TVM runtime, and nothing of edgetune. The
agent reaches it as a zipapp built from this tree: the package's root modules, the artifact
format core and the agent (`BOARD_SIDE`; tests/test_layers.py proves the agent's whole import
closure stays inside it). The zip is deterministic (sorted entries, fixed timestamps), so its
sha256 names exactly what runs: another edgetune version or a changed file is another hash.
Each module is there compiled, too (unchecked hash-based .pyc, PEP 552), for the host's Python:
a board with that Python imports the agent without compiling it on every call, and one with
another Python compiles the sources, as `zipimport` falls back to them.

`ensure_bundle` puts it at `<board workdir>/agent/edgetune-agent.pyz` only when the board's
copy has another hash, then reads the hash back on the board. `agent_argv` runs a verb through
a launcher that reads the copy once, checks its hash, and imports those very bytes (from a
private copy, which the agent's check child imports too): a bundle changed on the board since
is refused, never run, and one changed after the check is not what runs. `python edgetune-agent.pyz --root DIR VERB` also works
by hand on a board.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import marshal
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import edgetune
from edgetune.fleet.errors import BoardNotReady
from edgetune.fleet.ssh import BoardSession
from edgetune.inventory.schema import Board

PACKAGE = Path(edgetune.__file__).resolve().parent
BOARD_SIDE = ("__init__.py", "errors.py", "durable.py", "artifact_format", "agent")
AGENT_DIR = "agent"
BUNDLE_NAME = "edgetune-agent.pyz"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_MAIN = b'"""The edgetune board agent."""\nimport runpy\n\nrunpy.run_module("edgetune.agent", run_name="__main__", alter_sys=True)\n'

# Run by the board's Python as `-I -c LAUNCHER BUNDLE SHA256 ARGS...` (-I: nothing from the
# working directory, PYTHONPATH or the user's site can stand in for the bundle).
LAUNCHER = """\
import atexit, hashlib, os, runpy, shutil, sys, tempfile
path, expected = sys.argv[1:3]
try:
    with open(path, "rb") as bundle:
        data = bundle.read()
except OSError as err:
    sys.exit(f"edgetune agent bundle {path}: {err.strerror}; `edgetune fleet up` delivers it")
found = hashlib.sha256(data).hexdigest()
if found != expected:
    sys.exit(f"edgetune agent bundle {path} has sha256 {found}, not {expected}: refused, not run "
             "(changed on the board, or left by another edgetune version); `edgetune fleet up` replaces it")
# Import the very bytes just checked: a copy in a directory only this user can enter (Python
# reads a zip lazily, so importing `path` would read whatever it holds by then).
private = tempfile.mkdtemp(prefix=".run-", dir=os.path.dirname(os.path.abspath(path)))
atexit.register(shutil.rmtree, private, True)
checked = os.path.join(private, "agent.pyz")
with open(checked, "xb") as copy:
    copy.write(data)
del sys.argv[1:3]
sys.path.insert(0, checked)
runpy.run_module("edgetune.agent", run_name="__main__", alter_sys=True)
"""

_HASH_SCRIPT = """\
import hashlib, sys
try:
    with open(sys.argv[1], "rb") as bundle:
        print(hashlib.sha256(bundle.read()).hexdigest())
except FileNotFoundError:
    print("missing")
"""


@dataclass(frozen=True)
class AgentBundle:
    data: bytes
    sha256: str
    version: str  # edgetune's


def board_side_sources() -> list[Path]:
    """The package's Python files that go into the bundle, sorted."""
    found: list[Path] = []
    for part in BOARD_SIDE:
        path = PACKAGE / part
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return sorted(found)


@functools.cache
def agent_bundle() -> AgentBundle:
    """The bundle of this tree (built once per process; about 300 KB)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        sources = [
            (PurePosixPath("edgetune", *p.relative_to(PACKAGE).parts).as_posix(), p.read_bytes())
            for p in board_side_sources()
        ]
        compiled = [(f"{name}c", _pyc(name, source)) for name, source in sources]
        for name, data in [*sources, *compiled, ("__main__.py", _MAIN)]:
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    data = buffer.getvalue()
    return AgentBundle(data, hashlib.sha256(data).hexdigest(), edgetune.__version__)


def _pyc(name: str, source: bytes) -> bytes:
    """`source` compiled as a .pyc that is never checked against its source (the bundle's hash
    covers both). Marshal format 2 writes no back-references, whose use depends on the process's
    reference counts: every process writes the same bytes."""
    code = compile(source, name, "exec", dont_inherit=True, optimize=0)
    unchecked_hash = (0b01).to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + unchecked_hash + importlib.util.source_hash(source) + marshal.dumps(code, 2)


def agent_root(board: Board) -> str:
    """The agent's folder on the board: its bundle, config, pinned key, token, releases."""
    return f"{board.workdir.rstrip('/')}/{AGENT_DIR}"


def bundle_path(board: Board) -> str:
    return f"{agent_root(board)}/{BUNDLE_NAME}"


def ensure_bundle(session: BoardSession) -> bool:
    """Deliver the bundle unless the board's copy already has its hash; True if it was
    (re)written. The copy is read back and hashed on the board before it counts as delivered."""
    board, bundle = session.board, agent_bundle()
    path = bundle_path(board)
    if _board_sha256(session, path) == bundle.sha256:
        return False
    session.put_file(path, bundle.data, mode=0o644)
    found = _board_sha256(session, path)
    if found != bundle.sha256:
        raise BoardNotReady(
            f"{board.name}: the agent bundle written to {path} reads back with sha256 {found}, not {bundle.sha256} "
            "(disk full, or something on the board rewrites it)"
        )
    return True


def agent_argv(board: Board, *args: str) -> list[str]:
    """The command line that runs the board's bundle with `args`, after checking its hash."""
    return [board.python, "-I", "-c", LAUNCHER, bundle_path(board), agent_bundle().sha256, *args]


def _board_sha256(session: BoardSession, path: str) -> str:
    script = f"{shlex.quote(session.board.python)} -I -c {shlex.quote(_HASH_SCRIPT)} {shlex.quote(path)}"
    return session.run(script).stdout.strip()
