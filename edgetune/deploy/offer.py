"""Which artifact version a board should run: pure decisions over the inventory and the store.

A board runs, per model, the version pinned for it in the inventory, else the one pinned for its
device class, else the newest version of (model, its class). A board may also ask for one
version explicitly (rollback, staged rollouts): it gets it only if it exists for its own class.
`OfferError.status` is the HTTP status the server answers with. The answer is a `Choice`; the
server sends it to the board as a signed decision (`deploy.decisions`).

Only what the store's signed index lists is ever offered or served: `index.json`, checked
against `index.sig` with the fleet's public key, is re-read only when either file or the key
changes; a version it does not list (copied in by hand, or left by a build that crashed before
the index was rewritten), or whose manifest is not the one listed, is a 404.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from edgetune.artifact.index_check import read_signed_index
from edgetune.artifact.store import ArtifactStore, StoredVersion
from edgetune.artifact_format.places import INDEX_NAME, INDEX_SIGNATURE_NAME, StorePlace
from edgetune.artifact_format.signing import load_public_key
from edgetune.errors import ArtifactError, DeployError
from edgetune.inventory.schema import Board, Fleet

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class OfferError(DeployError):
    """A request that cannot be answered with an artifact; `status` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Choice:
    """The version `board` should get of a model: its pin, the newest, or the one it asked for."""

    board: Board
    stored: StoredVersion
    tarball_size: int
    pinned: bool
    requested: bool  # the board asked for this version

    @property
    def version(self) -> int:
        return self.stored.version


def check_name(kind: str, value: str) -> str:
    """`value` if it can name a board, model or class; a 400 otherwise (`..`, `/`, encodings)."""
    if not SAFE_NAME.fullmatch(value):
        raise OfferError(400, f"invalid {kind} name {value!r}")
    return value


def find_board(fleet: Fleet, name: str) -> Board:
    check_name("board", name)
    for board in fleet.boards:
        if board.name == name:
            return board
    raise OfferError(404, f"unknown board '{name}'")


def pinned_version(fleet: Fleet, board: Board, model: str) -> int | None:
    """The board's own pin, else its class's pin, else None (newest)."""
    if model in board.pin:
        return board.pin[model]
    return fleet.device_class(board.device_class).pin.get(model)


def offer(fleet: Fleet, store: ArtifactStore, board: Board, model: str, version: int | None = None) -> Choice:
    """What `board` should download for `model` (`version`: that one, if it exists for its class)."""
    check_name("model", model)
    if model not in {m.name for m in fleet.models}:
        raise OfferError(404, f"unknown model '{model}'")
    pinned = pinned_version(fleet, board, model) if version is None else None
    wanted = version if version is not None else pinned
    available = listed_versions(fleet, store, model, board.device_class)
    if not available:
        raise OfferError(404, f"no artifact of {model} for class {board.device_class} yet: run `edgetune build`")
    if wanted is None:
        wanted = available[-1]
    elif wanted not in available:
        what = "pinned version" if pinned is not None else "version"
        raise OfferError(
            404,
            f"{what} v{wanted} of {model} does not exist for class {board.device_class} (available: "
            + ", ".join(f"v{v}" for v in available)
            + ")",
        )
    return _choice_of(
        board, listed_version(fleet, store, model, board.device_class, wanted), pinned is not None, version is not None
    )


def _choice_of(board: Board, stored: StoredVersion, pinned: bool, requested: bool) -> Choice:
    size = stored.tarball.stat().st_size if stored.tarball.is_file() else 0
    if size == 0:
        raise OfferError(
            404, f"{stored.tarball.name} of {stored.model} for {stored.device_class} is missing: run `edgetune build`"
        )
    return Choice(board, stored, size, pinned, requested)


class SignedIndex:
    """The versions `index.json` lists (place -> manifest sha256), once its signature checked."""

    def __init__(self, root: Path, public_key: Path):
        self.root, self.public_key = Path(root), Path(public_key)
        self._known: tuple[tuple, dict[StorePlace, str]] | None = None

    def listed(self) -> dict[StorePlace, str]:
        files = (self.root / INDEX_NAME, self.root / INDEX_SIGNATURE_NAME, self.public_key)
        identity = tuple(_identity(path) for path in files)
        if self._known is None or self._known[0] != identity:
            self._known = (identity, self._read())
        return self._known[1]

    def _read(self) -> dict[StorePlace, str]:
        try:
            index = read_signed_index(self.root, load_public_key(self.public_key))
        except ArtifactError as err:
            raise OfferError(
                503,
                f"the store's signed index cannot be used, so nothing is offered ({err}): "
                "`edgetune verify` says why; `edgetune build` rewrites it",
            ) from None
        return {StorePlace(e.model, e.device_class, e.version): e.manifest_sha256 for e in index.versions}


_INDEXES: dict[tuple[Path, Path], SignedIndex] = {}


def signed_index(fleet: Fleet) -> SignedIndex:
    """The signed index of `fleet`'s store (one per store and key, re-read when they change)."""
    key = (Path(fleet.artifacts.dir), Path(fleet.artifacts.public_key))
    return _INDEXES.setdefault(key, SignedIndex(*key))


def listed_versions(fleet: Fleet, store: ArtifactStore, model: str, device_class: str) -> list[int]:
    """The servable versions of (model, class) that the signed index lists, ascending."""
    listed = signed_index(fleet).listed()
    return [v for v in store.servable_versions(model, device_class) if StorePlace(model, device_class, v) in listed]


def listed_version(fleet: Fleet, store: ArtifactStore, model: str, device_class: str, version: int) -> StoredVersion:
    """The version if it is servable and the signed index lists it with its manifest; else 404."""
    listed_sha256 = signed_index(fleet).listed().get(StorePlace(model, device_class, version))
    stored = store.servable(model, device_class, version) if listed_sha256 else None
    if stored is None or stored.manifest_sha256 != listed_sha256:
        raise OfferError(
            404, f"no version v{version} of {model} for class {device_class} is listed in the signed index"
        )
    return stored


def _identity(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
