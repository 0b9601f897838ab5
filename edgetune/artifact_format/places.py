"""Where things sit in an artifacts store: `<root>/<model>/<class>/v<N>/` (and `v<N>.tar.gz`
beside it), with `index.json` and `index.sig` at the root. Pure naming: no store is opened."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

INDEX_NAME = "index.json"
INDEX_SIGNATURE_NAME = "index.sig"
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a model or class directory
_VERSION_ENTRY = re.compile(r"^v([1-9][0-9]{0,9})(\.tar\.gz)?$")


@dataclass(frozen=True)
class StorePlace:
    """Where a version sits in a store: `<model>/<class>/v<version>`."""

    model: str
    device_class: str
    version: int

    def __str__(self) -> str:
        return f"{self.model}/{self.device_class}/v{self.version}"


def store_place(path: Path) -> StorePlace | None:
    """Where `path` sits if it is a version of an artifacts store, `<root>/<model>/<class>/v<N>`
    or `v<N>.tar.gz` with `<root>/index.json` beside the models; None anywhere else (a
    download directory, a board's install tree)."""
    path = Path(os.path.abspath(path))
    match = _VERSION_ENTRY.fullmatch(path.name)
    if match is None or len(path.parents) < 3:
        return None
    class_dir, model_dir = path.parent, path.parent.parent
    if not (SAFE_NAME.fullmatch(class_dir.name) and SAFE_NAME.fullmatch(model_dir.name)):
        return None
    if not (model_dir.parent / INDEX_NAME).is_file():
        return None
    return StorePlace(model_dir.name, class_dir.name, int(match.group(1)))
