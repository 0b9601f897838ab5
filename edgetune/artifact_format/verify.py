"""Verify a downloaded artifact (a version directory or its `.tar.gz`).

Checks, all reported together: the signature file against the exact bytes of `manifest.json`
and the public key; the manifest's schema; that it is what the caller expects (`Expected`:
model, device class, minimum version, and the place in the store it was found at, so an
artifact of another class, an old version renamed as a newer one, or a v1 copied to v2 is
refused); every listed file (missing, size, sha256). A directory is walked without following
links: a symbolic link, a FIFO, a device, a directory no listed file is in, or any unlisted
file is a problem. A tarball is checked as it is read (`files.open_archive`), without
extracting it: nothing is read past a manifest whose signature or expectations fail.
Any problem raises `VerificationError`, whose message names each one.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edgetune.artifact_format.files import (
    HEAD_NAMES,
    UnpackLimits,
    listing_problems,
    open_archive,
    path_problem,
    sha256_file,
    walk_tree,
)
from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME, FileEntry, Manifest
from edgetune.artifact_format.places import StorePlace, store_place
from edgetune.artifact_format.signing import MAX_SIGNATURE_BYTES, PublicKeys, signature_file_problems
from edgetune.errors import ArtifactError

TARBALL_SUFFIXES = (".tar.gz", ".tgz")
MAX_MANIFEST_BYTES = UnpackLimits().max_manifest_bytes


class VerificationError(ArtifactError):
    """The artifact must not be installed; `problems` lists every check that failed."""

    def __init__(self, artifact: Path, problems: list[str]):
        self.artifact, self.problems = artifact, problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{artifact} failed verification:\n{lines}")


@dataclass(frozen=True)
class Expected:
    """What the caller expects an artifact to be; a field left None is not checked."""

    model: str | None = None
    device_class: str | None = None
    min_version: int | None = None
    stored_as: StorePlace | None = None  # the place in a store it was found at

    def __post_init__(self) -> None:
        for name in ("model", "device_class"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ArtifactError(f"expected {name} must be a non-empty string, got {value!r}")
        version = self.min_version
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            raise ArtifactError(f"the minimum version must be a whole number >= 1, got {version!r}")
        if self.stored_as is not None and not isinstance(self.stored_as, StorePlace):
            raise ArtifactError(f"stored_as must be a StorePlace, got {type(self.stored_as).__name__}")

    @classmethod
    def for_path(
        cls, path: Path, model: str | None = None, device_class: str | None = None, min_version: int | None = None
    ) -> Expected:
        """These expectations, plus the place `path` has in an artifacts store (if it is in one)."""
        return cls(model, device_class, min_version, store_place(path))


def verify_artifact(path: Path, public_key: PublicKeys, expect: Expected | None = None) -> Manifest:
    """The artifact's manifest if the artifact at `path` is intact, signed by `public_key`, and
    what `expect` says it should be."""
    path, expect = Path(path), expect or Expected()
    if path.name.endswith(TARBALL_SUFFIXES) and path.is_file():
        return _verify_tarball(path, public_key, expect)
    if not path.is_dir():
        raise ArtifactError(f"{path}: not an artifact directory or .tar.gz")
    return _verify_dir(path, public_key, expect)


# --- artifacts ----------------------------------------------------------------------------


def _verify_tarball(path: Path, public_key: PublicKeys, expect: Expected) -> Manifest:
    try:
        with open_archive(path) as archive:
            manifest, problems = _checked_manifest(archive.manifest_bytes, archive.signature_bytes, public_key, expect)
            if manifest is None or problems:
                raise VerificationError(path, problems)
            problems = archive.check_members(manifest, dest=None)
    except VerificationError:
        raise
    except ArtifactError as err:
        raise VerificationError(path, [str(err)]) from None
    if problems:
        raise VerificationError(path, problems)
    return manifest


def _verify_dir(root: Path, public_key: PublicKeys, expect: Expected) -> Manifest:
    problems: list[str] = []
    data = read_small_file(root, MANIFEST_NAME, MAX_MANIFEST_BYTES, problems)
    sig_bytes = read_small_file(root, SIGNATURE_NAME, MAX_SIGNATURE_BYTES, problems)
    if data is None:
        raise VerificationError(root, problems)
    manifest, found = _checked_manifest(data, sig_bytes, public_key, expect)
    problems += found
    if manifest is None:
        raise VerificationError(root, problems)
    problems += _tree_problems(root, manifest.files)
    if problems:
        raise VerificationError(root, problems)
    return manifest


def _checked_manifest(
    data: bytes, sig_bytes: bytes | None, public_key: PublicKeys, expect: Expected
) -> tuple[Manifest | None, list[str]]:
    """The parsed manifest (None if it cannot be) and the problems of its signature (unless
    `sig_bytes` is None: already reported missing), its file list and the expectations."""
    problems = []
    if sig_bytes is not None:
        problems += signature_file_problems(public_key, data, sig_bytes, MANIFEST_NAME, SIGNATURE_NAME)
    try:
        manifest = Manifest.from_bytes(data)
    except ArtifactError as err:
        return None, problems + [str(err)]
    problems += [f"{MANIFEST_NAME}: {p}" for p in listing_problems(manifest.files)]
    return manifest, problems + _expectation_problems(manifest, expect)


def _expectation_problems(manifest: Manifest, expect: Expected) -> list[str]:
    built, problems = manifest.inputs, []
    if expect.model is not None and built.model != expect.model:
        problems.append(f"{MANIFEST_NAME}: built for model {built.model!r}, expected {expect.model!r}")
    if expect.device_class is not None and built.device_class != expect.device_class:
        problems.append(
            f"{MANIFEST_NAME}: built for device class {built.device_class!r}, expected "
            f"{expect.device_class!r} (its code may not run on {expect.device_class} boards)"
        )
    if expect.min_version is not None and manifest.version < expect.min_version:
        problems.append(
            f"{MANIFEST_NAME}: version {manifest.version}, expected v{expect.min_version} or newer "
            "(an older version offered as a newer one?)"
        )
    place = expect.stored_as
    if place is not None and (built.model, built.device_class, manifest.version) != (
        place.model,
        place.device_class,
        place.version,
    ):
        problems.append(
            f"{MANIFEST_NAME}: is {built.model}/{built.device_class}/v{manifest.version}, but it is stored "
            f"as {place} (copied or renamed from another version?)"
        )
    return problems


def read_small_file(root: Path, name: str, max_bytes: int, problems: list[str]) -> bytes | None:
    """The bytes of the regular file `root/name` (never through a link), or None with the
    problem appended."""
    path = root / name
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            problems.append(f"{name}: not a regular file (a link, directory or special file)")
            return None
        if info.st_size > max_bytes:
            problems.append(f"{name}: {info.st_size} bytes, more than the {max_bytes} allowed")
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        problems.append(f"{name}: missing")
    except OSError as err:
        problems.append(f"{name}: cannot be read ({err.strerror})")
    return None


def _tree_problems(root: Path, entries: tuple[FileEntry, ...]) -> list[str]:
    """Listed files against what the directory holds (walked without following links)."""
    try:
        tree = walk_tree(root)
    except ArtifactError as err:
        return [str(err)]
    except OSError as err:
        return [f"{root}: cannot be listed ({err.strerror})"]
    listed = {e.path: e for e in entries if path_problem(e.path) is None}
    problems = [p for e in listed.values() if (p := _entry_problem(root, e, tree.get(e.path)))]
    implied_dirs = {str(parent) for rel in listed for parent in PurePosixPath(rel).parents if str(parent) != "."}
    for rel, kind in tree.items():
        if rel in listed or rel in HEAD_NAMES or (kind == "dir" and rel in implied_dirs):
            continue
        problems.append(_unlisted_problem(rel, kind))
    return problems


def _unlisted_problem(rel: str, kind: str) -> str:
    if kind == "file":
        return f"{rel}: present but not listed in the manifest"
    if kind == "dir":
        return f"{rel}/: a directory that holds no listed file (not allowed in an artifact)"
    if kind == "symlink":
        return f"{rel}: a symbolic link (not allowed in an artifact)"
    return f"{rel}: a {kind} (not allowed in an artifact)"


def _entry_problem(root: Path, entry: FileEntry, kind: str | None) -> str | None:
    if kind is None:
        return f"{entry.path}: missing (listed in the manifest)"
    if kind != "file":
        return f"{entry.path}: a {kind}, not the regular file the manifest lists"
    path = root / entry.path
    try:
        size = os.lstat(path).st_size
        digest = sha256_file(path) if size == entry.size else None
    except OSError as err:
        return f"{entry.path}: cannot be read ({err.strerror})"
    if size != entry.size:
        return f"{entry.path}: size is {size} bytes, the manifest says {entry.size} (modified or cut short)"
    if digest != entry.sha256:
        return f"{entry.path}: sha256 is {digest}, the manifest says {entry.sha256} (modified)"
    return None


# --- the index ----------------------------------------------------------------------------
