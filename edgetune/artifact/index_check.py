"""Verify a store's signed index: `index.sig` is the signature of `index.json` by the fleet
key, every version it lists has the listed manifest, and every version directory is listed."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgetune.artifact.store import MAX_INDEX_BYTES, ArtifactStore, StoreIndex, index_unchanging
from edgetune.artifact_format.codec import sha256_hex
from edgetune.artifact_format.files import path_problem
from edgetune.artifact_format.manifest import MANIFEST_NAME
from edgetune.artifact_format.places import INDEX_NAME, INDEX_SIGNATURE_NAME, StorePlace
from edgetune.artifact_format.signing import MAX_SIGNATURE_BYTES, signature_file_problems
from edgetune.artifact_format.verify import MAX_MANIFEST_BYTES, VerificationError, read_small_file
from edgetune.errors import ArtifactError


def verify_index(root: Path, public_key: Ed25519PublicKey) -> StoreIndex:
    """The store's index if `index.sig` is its valid signature by `public_key`, and every version
    it lists has the listed manifest (and every version directory is listed)."""
    index = read_signed_index(root, public_key)
    problems = _index_problems(Path(root), index)
    if problems:
        raise VerificationError(Path(root), problems)
    return index


def read_signed_index(root: Path, public_key: Ed25519PublicKey) -> StoreIndex:
    """The store's index if `index.sig` is its valid signature by `public_key` (the versions it
    lists are not opened: what the artifact server checks before it offers one)."""
    root = Path(root)
    problems: list[str] = []
    with index_unchanging(root):  # not one file of the pair a commit is replacing
        data = read_small_file(root, INDEX_NAME, MAX_INDEX_BYTES, problems)
        sig_bytes = read_small_file(root, INDEX_SIGNATURE_NAME, MAX_SIGNATURE_BYTES, problems)
    if data is None:
        raise VerificationError(root, problems)
    if sig_bytes is not None:
        problems += signature_file_problems(public_key, data, sig_bytes, INDEX_NAME, INDEX_SIGNATURE_NAME)
    try:
        index = StoreIndex.from_bytes(data, INDEX_NAME)
    except ArtifactError as err:
        raise VerificationError(root, problems + [str(err)]) from None
    if problems:
        raise VerificationError(root, problems)
    return index


def _index_problems(root: Path, index: StoreIndex) -> list[str]:
    """Each listed version against its directory; version directories the index omits."""
    problems, listed = [], set()
    for entry in index.versions:
        place = StorePlace(entry.model, entry.device_class, entry.version)
        listed.add(place)
        if entry.path != str(place) or path_problem(entry.path) is not None:
            problems.append(f"{INDEX_NAME}: the entry for {place} points at {entry.path[:200]!r}")
            continue
        found: list[str] = []
        data = read_small_file(root / entry.path, MANIFEST_NAME, MAX_MANIFEST_BYTES, found)
        if data is None:
            problems += [f"{place}/{p}" for p in found]
        elif sha256_hex(data) != entry.manifest_sha256:
            problems.append(f"{place}/{MANIFEST_NAME}: not the manifest {INDEX_NAME} lists (modified or replaced)")
    problems += [
        f"{place}: a version directory {INDEX_NAME} does not list (copied in by hand, or its manifest is "
        "another version: see the warnings of the last `edgetune build`)"
        for place in ArtifactStore(root).places()
        if place not in listed
    ]
    return problems
