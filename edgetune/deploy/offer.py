"""Which artifact version a board should run: pure decisions over the inventory and the store.

A board runs, per model, the version pinned for it in the inventory, else the one pinned for its
device class, else the newest version of (model, its class). A board may also ask for one
version explicitly (rollback, staged rollouts): it gets it only if it exists for its own class.
`OfferError.status` is the HTTP status the server answers with. The answer is the agent's own
wire record (`agent.client.Offer`), so both ends of the wire share one definition.
"""

from __future__ import annotations

import re

from edgetune.agent.client import Offer
from edgetune.artifact.store import ArtifactStore, StoredVersion
from edgetune.errors import DeployError
from edgetune.inventory.schema import Board, Fleet

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class OfferError(DeployError):
    """A request that cannot be answered with an artifact; `status` is its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_name(kind: str, value: str) -> str:
    """`value` if it can name a board, model or class; a 400 otherwise (`..`, `/`, encodings)."""
    if not SAFE_NAME.match(value):
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


def offer(fleet: Fleet, store: ArtifactStore, board: Board, model: str, version: int | None = None) -> Offer:
    """What `board` should download for `model` (`version`: that one, if it exists for its class)."""
    check_name("model", model)
    if model not in {m.name for m in fleet.models}:
        raise OfferError(404, f"unknown model '{model}'")
    pinned = pinned_version(fleet, board, model) if version is None else None
    wanted = version if version is not None else pinned
    available = store.versions(model, board.device_class)
    if not available:
        raise OfferError(404, f"no artifact of {model} for class {board.device_class} yet: run `edgetune build`")
    if wanted is None:
        wanted = available[-1]
    elif wanted not in available:
        what = "pinned version" if pinned is not None else "version"
        raise OfferError(404, f"{what} v{wanted} of {model} does not exist for class {board.device_class} (available: "
                         + ", ".join(f"v{v}" for v in available) + ")")  # fmt: skip
    return _offer_of(board, store.get(model, board.device_class, wanted), pinned is not None)


def _offer_of(board: Board, stored: StoredVersion, pinned: bool) -> Offer:
    size = stored.tarball.stat().st_size if stored.tarball.is_file() else 0
    if size == 0:
        raise OfferError(404, f"{stored.tarball.name} of {stored.model} for {stored.device_class} is missing: run `edgetune build`")
    base = f"/v1/artifacts/{stored.model}/{board.device_class}/v{stored.version}"
    return Offer(
        board=board.name,
        device_class=board.device_class,
        model=stored.model,
        version=stored.version,
        pinned=pinned,
        manifest_url=f"{base}/manifest.json",
        signature_url=f"{base}/manifest.sig",
        tarball_url=f"{base}.tar.gz",
        manifest_sha256=stored.manifest_sha256,
        tarball_size=size,
    )
