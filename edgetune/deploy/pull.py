"""`edgetune pull BOARD`: what one board would get, verified, for inspection or manual flashing.

The version is chosen exactly as the server chooses it for that board (`offer`); the tarball is
verified against the fleet's public key and must be the model, class and version offered. It is
written as `<out>/<board>/<model>/v<N>.tar.gz` and unpacked beside it as `v<N>/`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from edgetune.artifact.files import unpack_tarball
from edgetune.artifact.signing import load_public_key
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact.verify import verify_artifact
from edgetune.deploy.offer import find_board, offer
from edgetune.errors import DeployError
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
    pulled = []
    for model in names:
        chosen = offer(fleet, store, board, model)
        stored = store.get(model, board.device_class, chosen.version)
        manifest = verify_artifact(stored.tarball, public_key)
        claimed = (manifest.inputs.model, manifest.inputs.device_class, manifest.version)
        if claimed != (model, board.device_class, chosen.version):
            raise DeployError(
                f"{stored.tarball} claims to be {claimed[0]} for {claimed[1]} v{claimed[2]}, but the store lists it as "
                f"{model} for {board.device_class} v{chosen.version}: do not ship it; rebuild with `edgetune build`"
            )
        pulled.append(_write(stored.tarball, out_dir / board.name / model, chosen.version, board.name, model))
    return pulled


def _write(tarball: Path, directory: Path, version: int, board: str, model: str) -> Pulled:
    directory.mkdir(parents=True, exist_ok=True)
    target_tarball = directory / f"v{version}.tar.gz"
    target_dir = directory / f"v{version}"
    shutil.copyfile(tarball, target_tarball)
    if target_dir.exists():
        shutil.rmtree(target_dir)
    unpack_tarball(target_tarball, target_dir)
    return Pulled(board, model, version, target_tarball, target_dir)
