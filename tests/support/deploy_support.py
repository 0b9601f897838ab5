"""Helpers of the deploy tests: signed versions published straight into the store, a library that sleeps, a model served on v1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def publish_version(fleet, model: str, device_class: str, payload: bytes):
    """Commit a small signed version of (model, class) whose library is `payload` (the server
    serves bytes; it never runs them)."""
    from edgetune.artifact.store import ArtifactStore
    from edgetune.artifact_format.signing import init_keys, load_private_key
    from edgetune.deploy.keys import ensure_decision_key
    from edgetune.deploy.tls import ensure_tls
    from support.tests_samples import sample_inputs, sample_manifest

    settings = fleet.artifacts
    if not settings.signing_key.exists():
        init_keys(settings.signing_key, settings.public_key, settings.dir)
    ensure_decision_key(fleet)  # as `keys init --if-missing` does
    ensure_tls(fleet)
    store = ArtifactStore(settings.dir)
    manifest = sample_manifest(
        sample_inputs(model=model, device_class=device_class, database_sha256=payload.hex()[:64].ljust(64, "0"))
    )
    with store.stage(model, device_class) as staging:
        (staging.path / "model.so").write_bytes(payload)
        return store.commit(staging, manifest, load_private_key(settings.signing_key)).stored


def republish(fleet, model: str, device_class: str, tag: str):
    """A new signed version of (model, class) holding the latest version's files (a real
    library) under changed build inputs, as a rebuild after a database change would make."""
    import shutil
    from dataclasses import replace

    from edgetune.artifact.store import ArtifactStore
    from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME
    from edgetune.artifact_format.signing import load_private_key

    store = ArtifactStore(fleet.artifacts.dir)
    latest = store.latest(model, device_class)
    inputs = replace(latest.manifest.inputs, edgetune_version=f"{latest.manifest.inputs.edgetune_version}+{tag}")
    manifest = replace(latest.manifest, inputs=inputs, inputs_sha256=inputs.digest())
    with store.stage(model, device_class) as staging:
        for item in latest.path.iterdir():
            if item.name in (MANIFEST_NAME, SIGNATURE_NAME):
                continue
            (shutil.copytree if item.is_dir() else shutil.copyfile)(item, staging.path / item.name)
        return store.commit(staging, manifest, load_private_key(fleet.artifacts.signing_key)).stored


def publish_copy(fleet, model: str, device_class: str, tag: str, library: bytes | None = None):
    """A signed version of `model` for `device_class`: the files of the newest built mlp of that
    class (a real library, its reference input and expected output), `library` instead of its
    model.so if given; the stored version."""
    import dataclasses
    import shutil

    from edgetune.artifact.store import ArtifactStore
    from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME
    from edgetune.artifact_format.signing import load_private_key

    store = ArtifactStore(fleet.artifacts.dir)
    built = store.latest("mlp", device_class)
    inputs = dataclasses.replace(
        built.manifest.inputs, model=model, edgetune_version=f"{built.manifest.inputs.edgetune_version}+{tag}"
    )
    manifest = dataclasses.replace(built.manifest, inputs=inputs, inputs_sha256=inputs.digest())
    with store.stage(model, device_class) as staging:
        for item in built.path.iterdir():
            if item.name not in (MANIFEST_NAME, SIGNATURE_NAME):
                (shutil.copytree if item.is_dir() else shutil.copyfile)(item, staging.path / item.name)
        if library is not None:
            (staging.path / "model.so").write_bytes(library)
        return store.commit(staging, manifest, load_private_key(fleet.artifacts.signing_key)).stored


SLEEPING_LIBRARY_C = """
#include <unistd.h>
__attribute__((constructor)) static void sleep_on_load(void) { sleep(90); }
"""


def sleeping_library(directory) -> bytes:
    """A shared library that sleeps 90 s when loaded (a reference check that outlives a deadline)."""
    import subprocess

    (directory / "sleep.c").write_text(SLEEPING_LIBRARY_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(directory / "sleep.so"), str(directory / "sleep.c")], check=True
    )
    return (directory / "sleep.so").read_bytes()


@contextmanager
def served_on_v1(fleet, model: str, device_class: str) -> Iterator[None]:
    """While the block runs: v1 of `model` for `device_class` published (`publish_copy`), the real
    artifact server up, and v1 rolled out to every board of that class."""
    from edgetune.deploy.rollout import plan_rollout, rollout
    from support.artifact_server import RunningServer

    publish_copy(fleet, model, device_class, "v1")
    server = RunningServer(fleet)
    try:
        result = rollout(fleet, plan_rollout(fleet, model, classes=[device_class], canary=0))
        assert result.ok, result.records()
        yield
    finally:
        server.stop()
