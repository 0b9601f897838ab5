"""The artifact store: `<root>/<model>/<class>/v<N>/`, `v<N>.tar.gz` beside it, `<root>/index.json`.

- Versions only grow, per (model, class). A committed build whose `inputs_sha256` equals the
  latest version's makes no new version (its staging directory is discarded).
- A version is staged in `<root>/<model>/<class>/.staging-<pid>-<hex>/`, its manifest written and
  signed there, then the directory is renamed to `v<N>`: a directory named `v<N>` is always
  complete. Staging directories of dead processes are removed at the next commit; readers
  never list them.
- Commits of one (model, class) are serialized by an flock on `<model>/<class>/.lock`; the index
  by one on `<root>/.index.lock`. `index.json` is rebuilt from the version directories and
  replaced atomically; a tarball missing after a crash is re-packed at the next commit.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgetune.artifact.codec import canonical_bytes, sha256_hex
from edgetune.artifact.files import file_entries, fsync_dir, pack_tarball, write_atomic
from edgetune.artifact.manifest import MANIFEST_NAME, SIGNATURE_NAME, Manifest
from edgetune.artifact.signing import sign
from edgetune.errors import ArtifactError

INDEX_NAME = "index.json"
INDEX_SCHEMA = "edgetune.artifact-index"
INDEX_SCHEMA_VERSION = 1

_VERSION_DIR = re.compile(r"^v([1-9][0-9]*)$")
_STAGING_PREFIX = ".staging-"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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


@dataclass(frozen=True)
class CommitResult:
    stored: StoredVersion
    created: bool  # False: the inputs equal the latest version's, which is returned


class Staging:
    """A private directory to write one version's files into, before `ArtifactStore.commit`."""

    def __init__(self, model: str, device_class: str, path: Path):
        self.model, self.device_class, self.path = model, device_class, path


class ArtifactStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    # --- reading -------------------------------------------------------------------------

    def class_dir(self, model: str, device_class: str) -> Path:
        for name in (model, device_class):
            if not _SAFE_NAME.match(name):
                raise ArtifactError(f"{name!r} cannot name an artifact directory")
        return self.root / model / device_class

    def versions(self, model: str, device_class: str) -> list[int]:
        """The complete versions of (model, class), ascending."""
        directory = self.class_dir(model, device_class)
        if not directory.is_dir():
            return []
        found = (_VERSION_DIR.match(p.name) for p in directory.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def get(self, model: str, device_class: str, version: int) -> StoredVersion:
        path = self.class_dir(model, device_class) / f"v{version}"
        data = (path / MANIFEST_NAME).read_bytes()
        manifest = Manifest.from_bytes(data, str(path / MANIFEST_NAME))
        return StoredVersion(model, device_class, version, path, manifest, sha256_hex(data))

    def latest(self, model: str, device_class: str) -> StoredVersion | None:
        versions = self.versions(model, device_class)
        return self.get(model, device_class, versions[-1]) if versions else None

    def all_versions(self) -> list[StoredVersion]:
        """Every complete version in the store, sorted by (model, class, version)."""
        if not self.root.is_dir():
            return []
        pairs = sorted(
            (m.name, c.name)
            for m in self.root.iterdir()
            if m.is_dir() and _SAFE_NAME.match(m.name)
            for c in m.iterdir()
            if c.is_dir() and _SAFE_NAME.match(c.name)
        )
        return [self.get(m, c, v) for m, c in pairs for v in self.versions(m, c)]

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
        """Turn `staging` into the next version: list its files in the manifest, sign it,
        rename, pack the tarball and rewrite the index. No new version if inputs are unchanged."""
        model, device_class = staging.model, staging.device_class
        with _locked(self.class_dir(model, device_class) / ".lock"):
            _remove_dead_staging(self.class_dir(model, device_class))
            latest = self.latest(model, device_class)
            if latest is not None and latest.manifest.inputs_sha256 == manifest.inputs_sha256:
                return CommitResult(latest, created=False)
            version = latest.version + 1 if latest else 1
            final = manifest.with_files(
                version, file_entries(staging.path, exclude=(MANIFEST_NAME, SIGNATURE_NAME))
            )
            data = final.to_bytes()
            write_atomic(staging.path / MANIFEST_NAME, data)
            write_atomic(staging.path / SIGNATURE_NAME, sign(key, data).to_bytes())
            target = staging.path.with_name(f"v{version}")
            os.rename(staging.path, target)
            fsync_dir(target.parent)
            stored = StoredVersion(model, device_class, version, target, final, sha256_hex(data))
            self._ensure_tarballs(model, device_class)
        self.write_index()
        return CommitResult(stored, created=True)

    def write_index(self) -> None:
        """Rebuild `index.json` from the version directories and replace it atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        with _locked(self.root / ".index.lock"):
            entries = [_index_entry(self.root, v) for v in self.all_versions()]
            index = {"schema": INDEX_SCHEMA, "schema_version": INDEX_SCHEMA_VERSION, "versions": entries}
            write_atomic(self.root / INDEX_NAME, canonical_bytes(index))

    def _ensure_tarballs(self, model: str, device_class: str) -> None:
        for version in self.versions(model, device_class):
            version_dir = self.class_dir(model, device_class) / f"v{version}"
            if not tarball_path(version_dir).exists():
                write_atomic(tarball_path(version_dir), pack_tarball(version_dir))


def tarball_path(version_dir: Path) -> Path:
    """`<model>/<class>/v<N>.tar.gz` beside the version directory `v<N>`."""
    return version_dir.with_name(f"{version_dir.name}.tar.gz")


def _index_entry(root: Path, stored: StoredVersion) -> dict:
    m = stored.manifest
    return {
        "model": stored.model,
        "device_class": stored.device_class,
        "version": stored.version,
        "path": stored.path.relative_to(root).as_posix(),
        "tarball": stored.tarball.relative_to(root).as_posix(),
        "manifest_sha256": stored.manifest_sha256,
        "inputs_sha256": m.inputs_sha256,
        "tuned_median_ms": m.tuned_median_ms(),
        "untuned_median_ms": m.untuned_median_ms(),
        "created": m.created,
    }


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove_dead_staging(directory: Path) -> None:
    """Remove staging directories whose process is gone (a crash mid-build)."""
    for path in directory.glob(f"{_STAGING_PREFIX}*"):
        pid = path.name[len(_STAGING_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
