"""Building and keeping releases: `artifacts/<model>/<class>/v<N>/` (+ `v<N>.tar.gz`, `index.json`).

The format of an artifact (manifest, signatures, files, verification) is `edgetune.artifact_format`,
which boards have too; this package is the host's side of it. Modules, one role each:
- `store`: versions (never reused), staging + fsync + atomic rename, tarballs, the signed index;
- `index_check`: check a store's signed index against its version directories;
- `release`: build, measure and check every (model, class), then commit (`edgetune build`);
- `measure`: run libraries on every board of a class through the tracker;
- `tuning_inputs`: what a release takes from tuning; `profile`: per-kernel profiles.
This package imports only the light modules; `release` and `measure` need TVM and the fleet.
"""

from edgetune.artifact.store import ArtifactStore, StoredVersion

__all__ = ["ArtifactStore", "StoredVersion"]
