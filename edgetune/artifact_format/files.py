"""Filesystem primitives of the artifact store: hashing, tree walks, deterministic tarballs.

A tarball made by `pack_tarball` depends only on the files' relative paths and bytes:
`manifest.json` and `manifest.sig` first, then the other files sorted; regular files only,
mtime 0, uid/gid 0, no user/group names, mode 0644, gzip header with mtime 0 and no file name.

`unpack_tarball` reads such a tarball forward, once, and trusts nothing before it is checked:
it reads `manifest.json` and `manifest.sig` (the first two members, size-capped) and checks the
signature when given a public key, before anything else is read; then it accepts only regular
files the manifest lists, each once, of exactly its listed size and sha256, and stops reading
the archive after the bytes the listing accounts for. A gzip bomb, a member that is not listed,
a link, a device, an absolute path or `..` are refused before their first byte is written.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME, FileEntry, Manifest
from edgetune.artifact_format.signing import MAX_SIGNATURE_BYTES, signature_file_problems
from edgetune.errors import ArtifactError

_CHUNK = 1 << 20
_BLOCK = 512
_RECORD = 20 * _BLOCK  # a tar stream is padded to whole records
HEAD_NAMES = (MANIFEST_NAME, SIGNATURE_NAME)
T = TypeVar("T")


@dataclass(frozen=True)
class UnpackLimits:
    """Bounds on what reading one artifact may cost, whatever its manifest claims."""

    max_manifest_bytes: int = 16 << 20
    max_members: int = 10_000
    max_total_bytes: int = 4 << 30  # of all listed files together


# --- hashing and walking ------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def walk_tree(root: Path, max_entries: int = UnpackLimits.max_members * 4) -> dict[str, str]:
    """Every entry under `root` (never following a link) as `{relative POSIX path: kind}`,
    sorted; kind is one of file, dir, symlink, fifo, socket, device. ArtifactError past
    `max_entries` entries."""
    found: dict[str, str] = {}
    pending = [""]
    while pending:
        prefix = pending.pop()
        for name in os.listdir(root / prefix if prefix else root):
            rel = f"{prefix}/{name}" if prefix else name
            kind = _kind(os.lstat(root / rel).st_mode)
            found[rel] = kind
            if len(found) > max_entries:
                raise ArtifactError(f"{root}: more than {max_entries} entries; not an artifact")
            if kind == "dir":
                pending.append(rel)
    return dict(sorted(found.items()))


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def relative_files(root: Path) -> list[str]:
    """Every regular file under `root` (links not followed), as sorted POSIX relative paths."""
    return [rel for rel, kind in walk_tree(root).items() if kind == "file"]


def file_entries(root: Path, exclude: tuple[str, ...] = ()) -> list[FileEntry]:
    return [
        FileEntry(path=rel, size=(root / rel).stat().st_size, sha256=sha256_file(root / rel))
        for rel in relative_files(root)
        if rel not in exclude
    ]


def tree_digest(root: Path) -> str:
    """One digest for a directory's files: sha256 over the sorted `path\\0sha256\\n` lines."""
    lines = "".join(f"{e.path}\0{e.sha256}\n" for e in file_entries(root))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def listing_problems(entries: tuple[FileEntry, ...]) -> list[str]:
    """What makes a manifest's file list unusable: unsafe or duplicate paths, bad sizes."""
    problems, seen = [], set()
    for entry in entries:
        reason = path_problem(entry.path)
        if reason is None and entry.path in seen:
            reason = "listed twice in the manifest"
        if reason is None and entry.size < 0:
            reason = f"a negative size ({entry.size}) in the manifest"
        if reason is not None:
            problems.append(f"{entry.path[:200]!r}: {reason}")
        seen.add(entry.path)
    return problems


def path_problem(rel: str) -> str | None:
    """Why `rel` cannot name a file of an artifact (None if it can)."""
    parts = PurePosixPath(rel).parts
    if not rel or "\0" in rel or "\\" in rel or len(rel.encode("utf-8", "replace")) > 1024:
        return "not a usable file name"
    if PurePosixPath(rel).is_absolute() or ".." in parts or PurePosixPath(rel).as_posix() != rel:
        return "not a normalized relative path inside the artifact"
    if rel in HEAD_NAMES:
        return "the manifest cannot list itself or its signature"
    if any(len(p.encode("utf-8", "replace")) > 255 for p in parts):
        return "a path component is longer than 255 bytes"
    return None


# --- packing ------------------------------------------------------------------------------


def pack_tarball(root: Path) -> bytes:
    """The deterministic .tar.gz bytes of every file under `root` (paths relative to it),
    `manifest.json` and `manifest.sig` first."""
    names = relative_files(root)
    ordered = [n for n in HEAD_NAMES if n in names] + [n for n in names if n not in HEAD_NAMES]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in ordered:
            info = tarfile.TarInfo(rel)
            info.size = (root / rel).stat().st_size
            info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, 0, "", ""
            with open(root / rel, "rb") as f:
                tar.addfile(info, f)
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


# --- unpacking ----------------------------------------------------------------------------


class _Budget:
    """A read-only stream that refuses to deliver more than `allowed` bytes in total: every
    decompressed byte of the archive is accounted for before it is read."""

    def __init__(self, stream: io.BufferedIOBase, allowed: int, name: str):
        self.stream, self.allowed, self.used, self.name = stream, allowed, 0, name

    def read(self, size: int = -1) -> bytes:
        if size < 0 or self.used + size > self.allowed:
            size = max(self.allowed - self.used, 0) + 1  # one byte more tells "too much" from EOF
        data = self.stream.read(size)
        self.used += len(data)
        if self.used > self.allowed:
            raise ArtifactError(
                f"{self.name}: holds more data than its manifest accounts for "
                f"(refused after {self.allowed} bytes: a damaged or malicious archive)"
            )
        return data


class ArtifactArchive:
    """An artifact tarball read forward once: `manifest_bytes` and `signature_bytes` (its
    first two members, read on opening), then `check_members`."""

    def __init__(self, path: Path, tar: tarfile.TarFile, budget: _Budget, limits: UnpackLimits):
        self.path, self._tar, self._budget, self.limits = path, tar, budget, limits
        self.manifest_bytes = self._read_head(MANIFEST_NAME, limits.max_manifest_bytes)
        self.signature_bytes = self._read_head(SIGNATURE_NAME, MAX_SIGNATURE_BYTES)

    def _read_head(self, name: str, max_bytes: int) -> bytes:
        member = self._tar.next()
        if member is None or member.name != name:
            found = "nothing" if member is None else repr(member.name[:200])
            raise ArtifactError(
                f"{self.path.name}: its member #{1 + HEAD_NAMES.index(name)} must be {name}, found {found} "
                "(not an edgetune artifact tarball, or packed by an older edgetune: rebuild it)"
            )
        if not member.isfile():
            raise ArtifactError(f"{self.path.name}: {name}: not a regular file")
        if member.size > max_bytes:
            raise ArtifactError(f"{self.path.name}: {name}: {member.size} bytes, more than the {max_bytes} allowed")
        return self._data(member).read()

    def check_members(self, manifest: Manifest, dest: Path | None) -> list[str]:
        """Read the rest of the archive against `manifest`'s file list, writing each file under
        `dest` (None: only check). Refuses (ArtifactError) at the first member that is not a
        listed regular file of its listed size, before reading its data; returns the content
        problems (sha256 differs, listed file absent)."""
        entries = self._checked_listing(manifest)
        self._budget.allowed = self._budget.used + sum(_archived_size(e.size) for e in entries.values()) + 20 * _BLOCK
        problems: list[str] = []
        seen: set[str] = set()
        while (member := self._tar.next()) is not None:
            entry = self._accept(member, entries, seen)
            digest = self._copy(member, entry, dest)
            if digest != entry.sha256:
                problems.append(f"{entry.path}: sha256 is {digest}, the manifest says {entry.sha256} (modified)")
        problems += [f"{p}: missing from the archive (listed in the manifest)" for p in entries if p not in seen]
        return problems

    def _checked_listing(self, manifest: Manifest) -> dict[str, FileEntry]:
        problems = listing_problems(manifest.files)
        if problems:
            raise ArtifactError(f"{self.path.name}: {MANIFEST_NAME}: " + "; ".join(problems[:5]))
        total = sum(e.size for e in manifest.files)
        if len(manifest.files) > self.limits.max_members or total > self.limits.max_total_bytes:
            raise ArtifactError(
                f"{self.path.name}: {MANIFEST_NAME} lists {len(manifest.files)} files of {total} bytes, more than "
                f"allowed ({self.limits.max_members} files, {self.limits.max_total_bytes} bytes)"
            )
        return {e.path: e for e in manifest.files}

    def _data(self, member: tarfile.TarInfo) -> IO[bytes]:
        """The data of `member`, a regular file (checked before)."""
        data = self._tar.extractfile(member)
        if data is None:
            raise ArtifactError(f"{self.path.name}: {member.name[:200]}: not a regular file")
        return data

    def _accept(self, member: tarfile.TarInfo, entries: dict[str, FileEntry], seen: set[str]) -> FileEntry:
        name = member.name[:200]
        entry = entries.get(member.name)
        if entry is None or not member.isfile():
            what = "not a regular file" if entry is not None else f"not listed in {MANIFEST_NAME}"
            raise ArtifactError(f"{self.path.name}: member {name!r} is {what}; refused before extracting it")
        if member.name in seen:
            raise ArtifactError(f"{self.path.name}: member {name!r} appears twice; refused")
        if member.size != entry.size:
            raise ArtifactError(
                f"{self.path.name}: member {name!r} is {member.size} bytes, {MANIFEST_NAME} says {entry.size}; "
                "refused before extracting it"
            )
        seen.add(member.name)
        return entry

    def _copy(self, member: tarfile.TarInfo, entry: FileEntry, dest: Path | None) -> str:
        """Stream the member's data (into `dest` if given); its sha256."""
        source, digest = self._data(member), hashlib.sha256()
        target = dest.joinpath(*PurePosixPath(entry.path).parts) if dest is not None else None
        with _created(target) as write:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                write(chunk)
        return digest.hexdigest()


def packed_size_bound(entries: tuple[FileEntry, ...], head_sizes: tuple[int, int]) -> int:
    """The most bytes `pack_tarball` can make of the files a manifest lists (`entries`) and its
    head (the sizes of manifest.json and manifest.sig): tar headers (pax ones included) and
    padding, the end blocks rounded up to a tar record, and gzip's worst case on data it cannot
    compress (stored blocks, 5 bytes per 64 KiB, and its header and trailer)."""
    members = [e.size for e in entries] + list(head_sizes)
    tar = sum(8 * _BLOCK + -(-size // _BLOCK) * _BLOCK for size in members) + 2 * _BLOCK
    tar = -(-tar // _RECORD) * _RECORD
    return tar + (tar >> 11) + 64


def _archived_size(size: int) -> int:
    """Bytes a member takes in a tar stream: its header, a possible pax header, padded data."""
    return 3 * _BLOCK + -(-size // _BLOCK) * _BLOCK


@contextmanager
def _created(target: Path | None) -> Iterator[Callable[[bytes], object]]:
    """A writer to the new file `target` (never an existing file, never through a link), or
    one that discards for None. Its OSErrors become ArtifactErrors that name the file."""
    if target is None:
        yield len
        return
    out = _guarded(target, lambda: _open_new(target))
    try:
        yield lambda chunk: _guarded(target, lambda: out.write(chunk))
    finally:
        _guarded(target, out.close)


def _open_new(target: Path) -> BinaryIO:
    target.parent.mkdir(parents=True, exist_ok=True)
    return os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb")


def _guarded(target: Path, action: Callable[[], T]) -> T:
    try:
        return action()
    except OSError as err:
        raise ArtifactError(
            f"cannot write {target} ({err.strerror or err}): extract into a new, writable directory"
        ) from None


@contextmanager
def open_archive(tarball: Path, limits: UnpackLimits = UnpackLimits()) -> Iterator[ArtifactArchive]:
    """The artifact tarball at `tarball`, its head read; ArtifactError if it is truncated,
    corrupt, or not laid out as `pack_tarball` makes it."""
    tarball = Path(tarball)
    head_budget = 2 * _archived_size(limits.max_manifest_bytes) + 20 * _BLOCK
    try:
        with open(tarball, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
            budget = _Budget(gz, head_budget, tarball.name)
            # typeshed asks any fileobj for write/seek/tell/close; a stream ("r|") is only read
            with tarfile.open(fileobj=budget, mode="r|") as tar:  # type: ignore[call-overload]
                yield ArtifactArchive(tarball, tar, budget, limits)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        raise ArtifactError(f"{tarball.name}: truncated or corrupt archive ({err}): download it again") from None


def unpack_tarball(
    tarball: Path,
    dest: Path,
    public_key: Ed25519PublicKey | None = None,
    limits: UnpackLimits = UnpackLimits(),
) -> Manifest:
    """Extract an artifact tarball made by `pack_tarball` into `dest` (created if missing; files
    already there are never overwritten) and return its manifest. With `public_key`, the
    manifest's signature is checked before anything else is read. ArtifactError for anything
    that is not exactly the listed files with their listed sizes and digests."""
    with open_archive(tarball, limits) as archive:
        problems = (
            signature_file_problems(
                public_key, archive.manifest_bytes, archive.signature_bytes, MANIFEST_NAME, SIGNATURE_NAME
            )
            if public_key is not None
            else []
        )
        if problems:
            raise ArtifactError(f"{Path(tarball).name}: " + "; ".join(problems))
        manifest = Manifest.from_bytes(archive.manifest_bytes, f"{Path(tarball).name}: {MANIFEST_NAME}")
        Path(dest).mkdir(parents=True, exist_ok=True)
        problems = archive.check_members(manifest, Path(dest))
    if problems:
        raise ArtifactError(f"{Path(tarball).name}: " + "; ".join(problems))
    return manifest
