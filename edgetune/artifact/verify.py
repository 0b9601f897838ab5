"""Verify a downloaded artifact: a version directory or its `.tar.gz`.

Checks, all reported together: the signature file against the exact bytes of `manifest.json`
and the public key; the manifest's schema; every listed file (missing, size, sha256); files
present but not listed. Any problem raises `VerificationError`, whose message names each one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgetune.artifact.files import relative_files, sha256_file, unpack_tarball
from edgetune.artifact.manifest import MANIFEST_NAME, SIGNATURE_NAME, FileEntry, Manifest
from edgetune.artifact.signing import Signature, signature_problem
from edgetune.errors import ArtifactError

TARBALL_SUFFIXES = (".tar.gz", ".tgz")


class VerificationError(ArtifactError):
    """The artifact must not be installed; `problems` lists every check that failed."""

    def __init__(self, artifact: Path, problems: list[str]):
        self.artifact, self.problems = artifact, problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{artifact} failed verification:\n{lines}")


def verify_artifact(path: Path, public_key: Ed25519PublicKey) -> Manifest:
    """The artifact's manifest if the artifact at `path` is intact and signed by `public_key`."""
    path = Path(path)
    if path.is_file() and path.name.endswith(TARBALL_SUFFIXES):
        with tempfile.TemporaryDirectory(prefix="edgetune-verify-") as tmp:
            try:
                unpack_tarball(path, Path(tmp))
            except ArtifactError as err:
                raise VerificationError(path, [str(err)]) from None
            return _verify_dir(Path(tmp), path, public_key)
    if not path.is_dir():
        raise ArtifactError(f"{path}: not an artifact directory or .tar.gz")
    return _verify_dir(path, path, public_key)


def _verify_dir(root: Path, shown_as: Path, public_key: Ed25519PublicKey) -> Manifest:
    problems: list[str] = []
    data = _read(root / MANIFEST_NAME, problems)
    sig_bytes = _read(root / SIGNATURE_NAME, problems)
    if data is None:
        raise VerificationError(shown_as, problems)
    if sig_bytes is not None:
        problems += _signature_problems(data, sig_bytes, public_key)
    try:
        manifest = Manifest.from_bytes(data)
    except ArtifactError as err:
        raise VerificationError(shown_as, problems + [str(err)]) from None
    problems += _file_problems(root, manifest.files)
    if problems:
        raise VerificationError(shown_as, problems)
    return manifest


def _read(path: Path, problems: list[str]) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        problems.append(f"{path.name}: missing")
    except OSError as err:
        problems.append(f"{path.name}: cannot be read ({err.strerror})")
    return None


def _signature_problems(data: bytes, sig_bytes: bytes, public_key: Ed25519PublicKey) -> list[str]:
    try:
        sig = Signature.from_bytes(sig_bytes, SIGNATURE_NAME)
    except ArtifactError as err:
        return [str(err)]
    problem = signature_problem(public_key, data, sig)
    return [f"{MANIFEST_NAME}: {problem}"] if problem else []


def _file_problems(root: Path, entries: tuple[FileEntry, ...]) -> list[str]:
    listed = {e.path for e in entries}
    problems = [p for e in entries if (p := _entry_problem(root, e))]
    problems += [
        f"{rel}: present but not listed in the manifest"
        for rel in relative_files(root)
        if rel not in listed and rel not in (MANIFEST_NAME, SIGNATURE_NAME)
    ]
    return problems


def _entry_problem(root: Path, entry: FileEntry) -> str | None:
    rel = PurePosixPath(entry.path)
    if rel.is_absolute() or ".." in rel.parts:
        return f"{entry.path}: not a path inside the artifact"
    path = root / entry.path
    if not path.is_file():
        return f"{entry.path}: missing (listed in the manifest)"
    size = path.stat().st_size
    if size != entry.size:
        return f"{entry.path}: size is {size} bytes, the manifest says {entry.size} (modified or cut short)"
    digest = sha256_file(path)
    if digest != entry.sha256:
        return f"{entry.path}: sha256 is {digest}, the manifest says {entry.sha256} (modified)"
    return None
