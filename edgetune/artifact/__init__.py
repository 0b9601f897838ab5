"""Signed, versioned artifacts: `artifacts/<model>/<class>/v<N>/` (+ `v<N>.tar.gz`, `index.json`).

Modules, one role each:
- `manifest`: the manifest schema (dataclasses, canonical JSON, inputs digest);
- `signing`: ed25519 keys and manifest signatures (`manifest.sig`);
- `store`: versions (never reused), staging + fsync + atomic rename, tarballs, the signed index;
- `verify`: check a version directory or tarball against its manifest, its signature and what
  the caller expects it to be; check the store's signed index;
- `release`: build, measure and check every (model, class), then commit (`edgetune build`);
- `measure`: run libraries on every board of a class through the tracker;
- `reference`, `tuning_inputs`, `files`, `codec`: reference data, what comes from tuning,
  tree walks and tarballs, canonical and strict JSON (fsynced writes: `edgetune.durable`).
This package imports only the light modules; `release` and `measure` need TVM and the fleet.
"""

from edgetune.artifact.manifest import SCHEMA, SCHEMA_VERSION, Manifest
from edgetune.artifact.signing import init_keys, load_private_key, load_public_key
from edgetune.artifact.store import ArtifactStore, StoredVersion
from edgetune.artifact.verify import Expected, VerificationError, verify_artifact, verify_index

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "ArtifactStore",
    "Expected",
    "Manifest",
    "StoredVersion",
    "VerificationError",
    "init_keys",
    "load_private_key",
    "load_public_key",
    "verify_artifact",
    "verify_index",
]
