"""The artifact store: `<root>/<model>/<class>/v<N>/`, `v<N>.tar.gz` beside it, a signed index.

- Versions only grow, per (model, class), and a number is never used twice: the highest
  version ever made is kept in `<model>/<class>/.highwater`, so deleting `v3/` and building
  again makes v4, never a second, different v3. A committed build whose `inputs_sha256` equals
  the latest version's makes no new version (its staging directory is discarded).
- A version is staged in `<root>/<model>/<class>/.staging-<pid>-<hex>/`, its manifest written and
  signed there, every file and directory fsynced, its tarball `v<N>.tar.gz` packed and written,
  then the directory is renamed to `v<N>`: a directory named `v<N>` is always complete, tarball
  included, so a reader never sees a newest version it cannot download, and a crash before the
  rename leaves the previous newest as it was. Staging directories of dead processes, and
  tarballs whose directory never appeared, are removed at the next commit; readers never list
  them.
- Commits of one (model, class) are serialized by an flock on `<model>/<class>/.lock`; the index
  by one on `<root>/.index.lock`. A tarball missing after a crash, or whose manifest differs
  from its directory's, is re-packed at the next commit of that (model, class).
- `index.json` lists every version whose manifest agrees with its place (model, class,
  version); it is rebuilt from the version directories, signed into `index.sig` with the
  artifact key, and both are replaced atomically (`index_check.verify_index` checks them);
  a reader holding `index_unchanging` reads the two as one pair.
- Symbolic links under the root are never followed: a linked model, class or version directory
  is not listed, and `servable` (what the artifact server may hand out) also refuses a linked
  manifest, signature or tarball, a version whose manifest is unreadable or another version's
  (copied by hand), or whose tarball is not of its manifest; each is skipped with a log line.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgetune.artifact_format.codec import canonical_bytes, load_versioned, sha256_hex
from edgetune.artifact_format.files import file_entries, open_archive, pack_tarball
from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME, Manifest
from edgetune.artifact_format.places import INDEX_NAME, INDEX_SIGNATURE_NAME, SAFE_NAME, StorePlace
from edgetune.artifact_format.signing import sign
from edgetune.durable import fsync_dir, fsync_tree, write_atomic
from edgetune.errors import ArtifactError

INDEX_SCHEMA = "edgetune.artifact-index"
INDEX_SCHEMA_VERSION = 1
HIGHWATER_NAME = ".highwater"
INDEX_LOCK_NAME = ".index.lock"
MAX_INDEX_BYTES = 64 << 20

_VERSION_DIR = re.compile(r"^v([1-9][0-9]{0,9})$")
_STAGING_PREFIX = ".staging-"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredVersion:
    """A complete version in the store."""

    model: str
    device_class: str
    version: int
    path: Path
    manifest: Manifest
    manifest_sha256: str  # of the manifest.json bytes as stored

    @property
    def tarball(self) -> Path:
        return tarball_path(self.path)

    def read(self, name: str) -> bytes:
        """The bytes of the file `name` of this version (manifest.json, manifest.sig), never
        read through a symbolic link."""
        return _read_no_follow(self.path / name)

    def misplacement(self) -> str | None:
        """None if the manifest is the version its directory says, else what it is."""
        m = self.manifest
        if (m.inputs.model, m.inputs.device_class, m.version) == (self.model, self.device_class, self.version):
            return None
        return f"its manifest is {m.inputs.model}/{m.inputs.device_class}/v{m.version}"


@dataclass(frozen=True)
class CommitResult:
    stored: StoredVersion
    created: bool  # False: the inputs equal the latest version's, which is returned


@dataclass(frozen=True)
class IndexEntry:
    model: str
    device_class: str
    version: int
    path: str  # of the version directory, relative to the store root
    tarball: str
    manifest_sha256: str
    inputs_sha256: str
    tuned_median_ms: float | None
    untuned_median_ms: float | None
    created: str


@dataclass(frozen=True)
class StoreIndex:
    """`index.json`: every version of the store (sorted by model, class, version)."""

    schema: str
    schema_version: int
    versions: tuple[IndexEntry, ...]

    @classmethod
    def from_bytes(cls, data: bytes, where: str = INDEX_NAME) -> StoreIndex:
        return load_versioned(cls, data, where, INDEX_SCHEMA, INDEX_SCHEMA_VERSION)


class Staging:
    """A private directory to write one version's files into, before `ArtifactStore.commit`."""

    def __init__(self, model: str, device_class: str, path: Path):
        self.model, self.device_class, self.path = model, device_class, path


class ArtifactStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._served: dict[StorePlace, tuple[tuple, StoredVersion | None]] = {}

    # --- reading -------------------------------------------------------------------------

    def class_dir(self, model: str, device_class: str) -> Path:
        for name in (model, device_class):
            if not SAFE_NAME.fullmatch(name):
                raise ArtifactError(f"{name!r} cannot name an artifact directory")
        return self.root / model / device_class

    def versions(self, model: str, device_class: str) -> list[int]:
        """The complete versions of (model, class), ascending."""
        directory = self.class_dir(model, device_class)
        if not (_is_real_dir(directory.parent) and _is_real_dir(directory)):
            return []
        found = (_VERSION_DIR.fullmatch(p.name) for p in directory.iterdir() if _is_real_dir(p))
        return sorted(int(m.group(1)) for m in found if m)

    def get(self, model: str, device_class: str, version: int) -> StoredVersion:
        path = self.class_dir(model, device_class) / f"v{version}"
        data = _read_no_follow(path / MANIFEST_NAME)
        manifest = Manifest.from_bytes(data, str(path / MANIFEST_NAME))
        return StoredVersion(model, device_class, version, path, manifest, sha256_hex(data))

    def latest(self, model: str, device_class: str) -> StoredVersion | None:
        versions = self.versions(model, device_class)
        return self.get(model, device_class, versions[-1]) if versions else None

    def places(self) -> list[StorePlace]:
        """Every complete version directory in the store (manifests not read), sorted."""
        if not self.root.is_dir():
            return []
        pairs = sorted(
            (m.name, c.name)
            for m in self.root.iterdir()
            if _is_real_dir(m) and SAFE_NAME.fullmatch(m.name)
            for c in m.iterdir()
            if _is_real_dir(c) and SAFE_NAME.fullmatch(c.name)
        )
        return [StorePlace(m, c, v) for m, c in pairs for v in self.versions(m, c)]

    def servable_versions(self, model: str, device_class: str) -> list[int]:
        """The versions of (model, class) the artifact server may hand out, ascending."""
        return [v for v in self.versions(model, device_class) if self.servable(model, device_class, v) is not None]

    def servable(self, model: str, device_class: str, version: int) -> StoredVersion | None:
        """The version if it may be handed out: reached through no symbolic link, its manifest
        readable and the version its place says, its tarball a regular file packed from that
        manifest. Otherwise None, and one log line saying why (checked again only when one of
        its files changes)."""
        place = StorePlace(model, device_class, version)
        paths = self._served_paths(place)
        identity = tuple(_identity(p) for p in paths)
        if identity[2] is None:
            return None  # no such version: nothing to report
        known = self._served.get(place)
        if known is None or known[0] != identity:
            stored, problem = self._check_servable(place, paths)
            if problem is not None:
                log.warning("warning: %s is not served: %s", place, problem)
            known = (identity, stored)
            self._served[place] = known
        return known[1]

    def _served_paths(self, place: StorePlace) -> tuple[Path, ...]:
        """The model, class and version directories, the manifest, signature and tarball."""
        version_dir = self.class_dir(place.model, place.device_class) / f"v{place.version}"
        return (
            version_dir.parent.parent,
            version_dir.parent,
            version_dir,
            version_dir / MANIFEST_NAME,
            version_dir / SIGNATURE_NAME,
            tarball_path(version_dir),
        )

    def _check_servable(self, place: StorePlace, paths: tuple[Path, ...]) -> tuple[StoredVersion | None, str | None]:
        problem = _link_problem(self.root, paths)
        if problem is not None:
            return None, problem
        try:
            stored = self.get(place.model, place.device_class, place.version)
        except (ArtifactError, OSError) as err:
            return None, f"its manifest cannot be read ({err}): rebuild it or remove the directory"
        problem = stored.misplacement()
        if problem is not None:
            return None, f"{problem} (copied or renamed by hand?): remove the directory"
        if not _tarball_is_current(stored.path):
            return None, "its tarball is missing or not of its manifest: `edgetune build` re-packs it"
        return stored, None

    def highwater(self, model: str, device_class: str) -> int:
        """The highest version ever made of (model, class) (0: none yet)."""
        path = self.class_dir(model, device_class) / HIGHWATER_NAME
        try:
            text = path.read_bytes()[:64].decode("ascii", "replace").strip()
        except FileNotFoundError:
            return 0
        if not re.fullmatch(r"[0-9]{1,10}", text):
            raise ArtifactError(
                f"{path} holds {text!r}, not a version number: it records the highest version ever "
                f"made of {model} for {device_class}, so that no number is used twice; write that "
                "number into it (at least the highest v<N> there is)"
            )
        return int(text)

    # --- writing -------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Fail early, before any build, if the store cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise ArtifactError(
                f"the artifacts directory {self.root} is not writable ({err.strerror}): fix its "
                "permissions or set artifacts.dir in the fleet file to a writable directory"
            ) from None

    @contextmanager
    def stage(self, model: str, device_class: str) -> Iterator[Staging]:
        """A fresh staging directory, removed on exit unless `commit` renamed it."""
        directory = self.class_dir(model, device_class)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{_STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir()
        try:
            yield Staging(model, device_class, path)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def commit(self, staging: Staging, manifest: Manifest, key: Ed25519PrivateKey) -> CommitResult:
        """Turn `staging` into the next version: list its files in the manifest, sign it, pack
        the tarball, rename, and rewrite the signed index. No new version if inputs are
        unchanged."""
        model, device_class = staging.model, staging.device_class
        directory = self.class_dir(model, device_class)
        with _locked(directory / ".lock"):
            _remove_dead_staging(directory)
            _remove_orphan_tarballs(directory)
            latest = self.latest(model, device_class)
            if latest is not None and latest.manifest.inputs_sha256 == manifest.inputs_sha256:
                return CommitResult(latest, created=False)
            version = max([self.highwater(model, device_class), *_taken_numbers(directory)]) + 1
            final = manifest.with_files(version, file_entries(staging.path, exclude=(MANIFEST_NAME, SIGNATURE_NAME)))
            data = final.to_bytes()
            write_atomic(staging.path / MANIFEST_NAME, data)
            write_atomic(staging.path / SIGNATURE_NAME, sign(key, data).to_bytes())
            fsync_tree(staging.path)
            write_atomic(directory / HIGHWATER_NAME, f"{version}\n".encode())
            target = directory / f"v{version}"
            write_atomic(tarball_path(target), pack_tarball(staging.path))  # before the version appears
            os.rename(staging.path, target)
            fsync_dir(directory)
            stored = StoredVersion(model, device_class, version, target, final, sha256_hex(data))
            self._ensure_tarballs(model, device_class)
        self.write_index(key)
        return CommitResult(stored, created=True)

    def write_index(self, key: Ed25519PrivateKey) -> StoreIndex:
        """Rebuild `index.json` from the version directories, sign it into `index.sig`, and
        replace both atomically. Versions that cannot be read, or whose manifest is another
        version than its directory says (copied or renamed by hand), are left out."""
        self.root.mkdir(parents=True, exist_ok=True)
        with _locked(self.root / INDEX_LOCK_NAME):
            entries = tuple(_index_entry(self.root, v) for v in self._indexable_versions())
            index = StoreIndex(INDEX_SCHEMA, INDEX_SCHEMA_VERSION, entries)
            data = canonical_bytes(index)
            write_atomic(self.root / INDEX_NAME, data)
            write_atomic(self.root / INDEX_SIGNATURE_NAME, sign(key, data).to_bytes())
        return index

    def resign(self, key: Ed25519PrivateKey) -> int:
        """Sign every version's manifest and the index again with `key` (the artifact key's
        successor), each tarball re-packed to match; the number of versions signed."""
        signed = 0
        for model, device_class in sorted({(p.model, p.device_class) for p in self.places()}):
            directory = self.class_dir(model, device_class)
            with _locked(directory / ".lock"):
                for version in self.versions(model, device_class):
                    version_dir = directory / f"v{version}"
                    try:
                        data = _read_no_follow(version_dir / MANIFEST_NAME)
                    except OSError as err:
                        log.warning("warning: %s/%s v%d not signed again: %s", model, device_class, version, err)
                        continue
                    write_atomic(version_dir / SIGNATURE_NAME, sign(key, data).to_bytes())
                    signed += 1
                self._ensure_tarballs(model, device_class)
        self.write_index(key)
        return signed

    def _indexable_versions(self) -> Iterator[StoredVersion]:
        for place in self.places():
            try:
                stored = self.get(place.model, place.device_class, place.version)
            except (ArtifactError, OSError) as err:
                log.warning("warning: %s left out of %s: %s", place, INDEX_NAME, err)
                continue
            problem = stored.misplacement()
            if problem:
                log.warning("warning: %s left out of %s: %s (copied or renamed by hand?)", place, INDEX_NAME, problem)
                continue
            yield stored

    def _ensure_tarballs(self, model: str, device_class: str) -> None:
        for version in self.versions(model, device_class):
            version_dir = self.class_dir(model, device_class) / f"v{version}"
            if not _tarball_is_current(version_dir):
                write_atomic(tarball_path(version_dir), pack_tarball(version_dir))


def tarball_path(version_dir: Path) -> Path:
    """`<model>/<class>/v<N>.tar.gz` beside the version directory `v<N>`."""
    return version_dir.with_name(f"{version_dir.name}.tar.gz")


def _tarball_is_current(version_dir: Path) -> bool:
    """The tarball beside `version_dir` exists and starts with that directory's manifest.json
    and manifest.sig (a tarball left from a deleted, reused or modified version does not)."""
    tarball = tarball_path(version_dir)
    if not _is_regular_file(tarball):
        return False
    try:
        with open_archive(tarball) as archive:
            head = (archive.manifest_bytes, archive.signature_bytes)
        return head == (_read_no_follow(version_dir / MANIFEST_NAME), _read_no_follow(version_dir / SIGNATURE_NAME))
    except (ArtifactError, OSError):
        return False


def _index_entry(root: Path, stored: StoredVersion) -> IndexEntry:
    m = stored.manifest
    return IndexEntry(
        model=stored.model,
        device_class=stored.device_class,
        version=stored.version,
        path=stored.path.relative_to(root).as_posix(),
        tarball=stored.tarball.relative_to(root).as_posix(),
        manifest_sha256=stored.manifest_sha256,
        inputs_sha256=m.inputs_sha256,
        tuned_median_ms=m.tuned_median_ms(),
        untuned_median_ms=m.untuned_median_ms(),
        created=m.created,
    )


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle, _flocked(handle, fcntl.LOCK_EX):
        yield


@contextmanager
def _flocked(handle, operation: int) -> Iterator[None]:
    fcntl.flock(handle, operation)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def index_unchanging(root: Path) -> Iterator[None]:
    """While held, `write_index` replaces neither `index.json` nor `index.sig` (a shared lock on
    the index lock): read the two under it and they are one pair. A store that never wrote an
    index has nothing to hold."""
    lock = Path(root) / INDEX_LOCK_NAME
    if not lock.exists():  # the lock file, once made, is never removed
        yield
        return
    with open(lock, "rb") as handle, _flocked(handle, fcntl.LOCK_SH):
        yield


def _remove_dead_staging(directory: Path) -> None:
    """Remove staging directories whose process is gone (a crash mid-build)."""
    for path in directory.glob(f"{_STAGING_PREFIX}*"):
        pid = path.name[len(_STAGING_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _remove_orphan_tarballs(directory: Path) -> None:
    """Remove `v<N>.tar.gz` files whose `v<N>` never appeared (a commit that crashed between
    writing the tarball and renaming the version into place)."""
    for path in directory.glob("v*.tar.gz"):
        version_name = path.name.removesuffix(".tar.gz")
        if _VERSION_DIR.fullmatch(version_name) and _identity(path.with_name(version_name)) is None:
            path.unlink(missing_ok=True)


def _taken_numbers(directory: Path) -> list[int]:
    """Every number a `v<N>` or `v<N>.tar.gz` entry of `directory` uses, whatever its kind."""
    found = (_VERSION_DIR.fullmatch(p.name.removesuffix(".tar.gz")) for p in directory.iterdir())
    return [int(m.group(1)) for m in found if m]


def _identity(path: Path) -> tuple | None:
    """What changes when the entry at `path` (itself, never a link's target) is replaced or
    modified; None if there is none."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _is_real_dir(path: Path) -> bool:
    found = _identity(path)
    return found is not None and stat.S_ISDIR(found[2])


def _is_regular_file(path: Path) -> bool:
    found = _identity(path)
    return found is not None and stat.S_ISREG(found[2])


def _link_problem(root: Path, paths: tuple[Path, ...]) -> str | None:
    """Why one of `paths` (under `root`) may not be served: a symbolic link, or a path that
    resolves outside the root; None if none."""
    real_root = os.path.realpath(root)
    for path in paths:
        found = _identity(path)
        if found is not None and stat.S_ISLNK(found[2]):
            return f"{path.relative_to(root)} is a symbolic link (links under the store are never followed)"
        if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
            return f"{path.relative_to(root)} resolves outside the store"
    return None


def _read_no_follow(path: Path) -> bytes:
    """The bytes of the regular file `path`; OSError if it is a symbolic link or not a file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return f.read()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
