"""Filesystem primitives of the artifact store: hashing, atomic writes, deterministic tarballs.

A tarball made by `pack_tarball` depends only on the files' relative paths and bytes: members
sorted, regular files only, mtime 0, uid/gid 0, no user/group names, mode 0644, gzip header
with mtime 0 and no file name. `unpack_tarball` accepts only such members (no links, devices,
absolute paths or `..`), so a downloaded tarball cannot write outside its destination.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from edgetune.artifact.manifest import FileEntry
from edgetune.errors import ArtifactError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def relative_files(root: Path) -> list[str]:
    """Every regular file under `root`, as sorted POSIX paths relative to it."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


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


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a temporary name beside `path`, fsync, then rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pack_tarball(root: Path) -> bytes:
    """The deterministic .tar.gz bytes of every file under `root` (paths relative to it)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in relative_files(root):
            info = tarfile.TarInfo(rel)
            info.size = (root / rel).stat().st_size
            info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, 0, "", ""
            with open(root / rel, "rb") as f:
                tar.addfile(info, f)
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def unpack_tarball(tarball: Path, dest: Path) -> None:
    """Extract a tarball made by `pack_tarball` into `dest`; ArtifactError if it is truncated,
    corrupt, or holds anything but plain relative files."""
    try:
        with tarfile.open(tarball, mode="r:gz") as tar:
            for member in tar:
                _extract_member(tar, member, dest, tarball)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        raise ArtifactError(
            f"{tarball.name}: truncated or corrupt archive ({err}): download it again"
        ) from None


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, tarball: Path) -> None:
    rel = PurePosixPath(member.name)
    if not member.isfile() or rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ArtifactError(f"{tarball.name}: unexpected member {member.name!r} (only plain files are allowed)")
    target = dest.joinpath(*rel.parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    with open(target, "wb") as out:
        while chunk := source.read(_CHUNK):
            out.write(chunk)
    if target.stat().st_size != member.size:
        raise EOFError(f"{member.name} is cut short")
