"""`edgetune pull BOARD`: what one board would get, verified, for inspection or manual flashing.

The version is chosen exactly as the server chooses it for that board (`offer`); the tarball is
verified against the fleet's public key and must be the model, class and version offered. It is
written as `<out>/<board>/<model>/v<N>.tar.gz` and unpacked beside it as `v<N>/`; the fleet's
trust file as `<out>/<board>/trust.json`, which the board's agent takes with `install --from
TARBALL --trust trust.json` (a board that never reached the server then follows the key
rotations it missed).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgetune.artifact.store import ArtifactStore, StoredVersion
from edgetune.artifact_format.files import unpack_tarball
from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME
from edgetune.artifact_format.signing import load_public_key
from edgetune.artifact_format.verify import Expected, verify_artifact
from edgetune.deploy.keys import TRUST_NAME, KeyFiles, read_trust
from edgetune.deploy.offer import find_board, offer
from edgetune.inventory.schema import Fleet


@dataclass(frozen=True)
class Pulled:
    board: str
    model: str
    version: int
    tarball: Path
    directory: Path


def pull(fleet: Fleet, board_name: str, models: Sequence[str] = (), out_dir: Path = Path("pulled")) -> list[Pulled]:
    """Every model (or those named) that `board_name` would install, verified and unpacked."""
    board = find_board(fleet, board_name)
    store = ArtifactStore(fleet.artifacts.dir)
    public_key = load_public_key(fleet.artifacts.public_key)
    names = list(models) or [m.name for m in fleet.models]
    (out_dir / board.name).mkdir(parents=True, exist_ok=True)
    (out_dir / board.name / TRUST_NAME).write_bytes(read_trust(KeyFiles.of(fleet).trust).to_bytes())
    pulled = []
    for model in names:
        chosen = offer(fleet, store, board, model)
        stored = store.get(model, board.device_class, chosen.version)
        verify_artifact(
            stored.tarball, public_key, Expected.for_path(stored.tarball, model, board.device_class, chosen.version)
        )
        pulled.append(_write(stored, out_dir / board.name / model, board.name))
    return pulled


def _write(stored: StoredVersion, directory: Path, board: str) -> Pulled:
    """The tarball, and beside it the same files unpacked (with the signed manifest)."""
    directory.mkdir(parents=True, exist_ok=True)
    target_tarball = directory / stored.tarball.name
    target_dir = directory / stored.path.name
    shutil.copyfile(stored.tarball, target_tarball)
    if target_dir.exists():
        shutil.rmtree(target_dir)
    unpack_tarball(target_tarball, target_dir)
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        shutil.copyfile(stored.path / name, target_dir / name)
    return Pulled(board, stored.model, stored.version, target_tarball, target_dir)
