"""Helpers of the deploy tests (imported by name: this folder is on sys.path during them)."""

from __future__ import annotations


def publish_version(fleet, model: str, device_class: str, payload: bytes):
    """Commit a small signed version of (model, class) whose library is `payload` (the server
    serves bytes; it never runs them)."""
    from edgetune.artifact.signing import init_keys, load_private_key
    from edgetune.artifact.store import ArtifactStore
    from tests_samples import sample_inputs, sample_manifest

    settings = fleet.artifacts
    if not settings.signing_key.exists():
        init_keys(settings.signing_key, settings.public_key, settings.dir)
    store = ArtifactStore(settings.dir)
    manifest = sample_manifest(sample_inputs(model=model, device_class=device_class, database_sha256=payload.hex()[:64].ljust(64, "0")))
    with store.stage(model, device_class) as staging:
        (staging.path / "model.so").write_bytes(payload)
        return store.commit(staging, manifest, load_private_key(settings.signing_key)).stored
