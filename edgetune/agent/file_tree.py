"""The agent's files on the board, under its root directory:

    agent.json, token, fleet.pub        written by the operator's rollout (fleet.pub: the anchor key)
    trust-offered.json                  a trust file the rollout left, taken (or refused) once
    trust.json                          the trust file the board took (`artifact_format.trust`)
    state.json                          what runs, since when (see `state.py`), replaced atomically
    decisions.json                      the highest serial of the server's signed decisions seen
    releases/<model>/v<N>/              an installed, verified release (a `v<N>` is always complete)
    releases/<model>/current -> v<N>    relative symlink, switched atomically (temp link + rename)
    releases/<model>/.staging-*         an install in progress; .trash-*: a release being removed
    downloads/<model>-v<N>.tar.gz       a complete download (.part while downloading, resumable)
    .lock                               held by the run that changes anything (one at a time)

Staging and trash directories and temporary links are only ever left by a killed run: the
next run that takes the lock removes them.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgetune.agent.config import SAFE_NAME
from edgetune.agent.errors import AgentConfigError, AgentError
from edgetune.durable import fsync_dir

RELEASE_DIR = re.compile(r"^v([1-9][0-9]*)$")
CURRENT = "current"
LOCK_POLL_S = 0.2
_LEFTOVER_PREFIXES = (".staging-", ".trash-", f".{CURRENT}.tmp-")


def check_model_name(model: str) -> str:
    if not SAFE_NAME.fullmatch(model):
        raise AgentConfigError(f"{model!r} is not a model name")
    return model


class FileTree:
    """Paths under the agent's root."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.state = self.root / "state.json"
        self.decisions = self.root / "decisions.json"
        self.trust = self.root / "trust.json"
        self.offered_trust = self.root / "trust-offered.json"
        self.releases = self.root / "releases"
        self.downloads = self.root / "downloads"

    def model_dir(self, model: str) -> Path:
        return self.releases / check_model_name(model)

    def release(self, model: str, version: int) -> Path:
        return self.model_dir(model) / f"v{version}"

    def current_link(self, model: str) -> Path:
        return self.model_dir(model) / CURRENT

    def tarball(self, model: str, version: int) -> Path:
        return self.downloads / f"{check_model_name(model)}-v{version}.tar.gz"

    def partial(self, model: str, version: int) -> Path:
        tarball = self.tarball(model, version)
        return tarball.with_name(f"{tarball.name}.part")

    def partial_etag(self, model: str, version: int) -> Path:
        """The ETag of the partial download: a resumed request must get the same file."""
        partial = self.partial(model, version)
        return partial.with_name(f"{partial.name}.etag")

    def models(self) -> list[str]:
        """Models with a directory under releases/."""
        if not self.releases.is_dir():
            return []
        return sorted(p.name for p in self.releases.iterdir() if p.is_dir() and SAFE_NAME.fullmatch(p.name))

    def kept_versions(self, model: str) -> list[int]:
        """The complete releases of `model` on the board, ascending."""
        directory = self.model_dir(model)
        if not directory.is_dir():
            return []
        found = (RELEASE_DIR.fullmatch(p.name) for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
        return sorted(int(m.group(1)) for m in found if m)

    def current_version(self, model: str) -> int | None:
        """The version `current` points to; None when nothing is active (no link, or a link the
        agent did not make: the next install or `rollback --to N` replaces it)."""
        try:
            match = RELEASE_DIR.fullmatch(os.readlink(self.current_link(model)))
        except OSError:  # no link (or not a link)
            return None
        return int(match.group(1)) if match else None

    def current_since(self, model: str) -> float | None:
        """When `current` was last switched (the link's own mtime)."""
        try:
            return os.lstat(self.current_link(model)).st_mtime
        except FileNotFoundError:
            return None

    def switch_current(self, model: str, version: int | None) -> None:
        """Point `current` at v<version> atomically (None: remove it)."""
        link = self.current_link(model)
        if version is None:
            link.unlink(missing_ok=True)
        else:
            temporary = link.with_name(f".{CURRENT}.tmp-{os.getpid()}")
            temporary.unlink(missing_ok=True)
            os.symlink(f"v{version}", temporary)
            os.replace(temporary, link)
        fsync_dir(link.parent)

    def new_staging(self, model: str, version: int) -> Path:
        directory = self.model_dir(model)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f".staging-v{version}-{secrets.token_hex(4)}"
        path.mkdir()
        return path

    def place_release(self, model: str, version: int, staging: Path) -> Path:
        """Rename a checked staging directory to v<version>, replacing a stale copy (never the
        current one: the caller knows it is not)."""
        target = self.release(model, version)
        if target.exists():
            self.remove_release(model, version)
        os.rename(staging, target)
        fsync_dir(target.parent)
        return target

    def remove_release(self, model: str, version: int) -> None:
        """Rename v<version> away first, so that a kill mid-removal never leaves a partial v<N>."""
        trash = self.model_dir(model) / f".trash-v{version}-{secrets.token_hex(4)}"
        os.rename(self.release(model, version), trash)
        fsync_dir(trash.parent)
        shutil.rmtree(trash, ignore_errors=True)

    def remove_download(self, model: str, version: int) -> None:
        for path in (self.tarball(model, version), self.partial(model, version), self.partial_etag(model, version)):
            path.unlink(missing_ok=True)

    def remove_other_partials(self, model: str, version: int) -> list[Path]:
        """Remove the partial downloads (and their ETags) of `model`'s versions other than
        `version`: the board will never resume them. Returns what was removed."""
        pattern = re.compile(rf"{re.escape(check_model_name(model))}-v([1-9][0-9]*)\.tar\.gz\.part(\.etag)?")
        stale = [
            path
            for path in (self.downloads.iterdir() if self.downloads.is_dir() else ())
            if (match := pattern.fullmatch(path.name)) and int(match.group(1)) != version
        ]
        for path in stale:
            path.unlink(missing_ok=True)
        return stale

    def remove_leftovers(self) -> list[Path]:
        """Remove what killed runs left (staging and trash directories, temporary links and
        files); call with the lock held. Returns what was removed."""
        leftovers = [
            path
            for model in self.models()
            for path in self.model_dir(model).iterdir()
            if path.name.startswith(_LEFTOVER_PREFIXES)
        ]
        leftovers += [path for d in (self.root, self.downloads) if d.is_dir() for path in d.glob(".*.tmp-*")]
        for path in leftovers:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return leftovers

    @contextmanager
    def locked(self, wait_s: float = 0.0) -> Iterator[None]:
        """Hold `<root>/.lock`: one changing run at a time (a killed run's lock goes with it);
        wait up to `wait_s` for another run (a pull timer's, a rollout's) to let it go."""
        deadline = time.monotonic() + wait_s
        with open(self.root / ".lock", "a") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise AgentError(
                            f"another agent run is changing {self.root} (it holds .lock): "
                            "wait for it to finish, then run again"
                        ) from None
                    time.sleep(LOCK_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
