"""`fetch`: download the artifact the server offers this board, and accept it only if it is for
this board.

Order (nothing large is downloaded before the small checks pass):
1. the offer: which version (the newest, the pinned one, or the one asked), for this board,
   acted on only if its signed decision (`artifact_format.decision`) verifies with the decision
   key the board's trusted keys certify (`artifact_format.trust`: the server's trust file is
   taken first if it extends the board's), was made for this request, is newer than every decision seen here (its serial is then recorded)
   and is exactly what the offer says;
2. a version below the board's high-water mark is refused (a replayed older, validly signed
   artifact must not downgrade a board), unless the operator allows the downgrade;
3. manifest.json + manifest.sig: signed by the newest artifact key, for this board's class, the
   model asked and the version offered;
4. the tarball, into `downloads/<model>-v<N>.tar.gz.part` (resuming a partial one), renamed
   when complete, then verified (every file against the manifest inside, signed by that
   key) and that manifest must be byte-identical to the signed one fetched in 3. Before its
   first byte: the offered size must be one the signed manifest's files can pack into, and the
   agent root's filesystem must have room for it, its unpacked files and `DISK_MARGIN_BYTES`;
   partial downloads of the model's other versions (and unusable ones) are removed.
A complete download already there is reused if it verifies, and discarded if not.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgetune.agent.client import ArtifactServer, Offer
from edgetune.agent.config import AgentConfig
from edgetune.agent.errors import AgentError
from edgetune.agent.file_tree import FileTree, check_model_name
from edgetune.agent.installation import Installation
from edgetune.agent.state import ModelState, last_decision_serial, record_decision_serial
from edgetune.artifact_format.codec import sha256_hex
from edgetune.artifact_format.decision import Asked, Decision, check_decision
from edgetune.artifact_format.files import packed_size_bound
from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME, Manifest
from edgetune.artifact_format.signing import Signature, signature_problem
from edgetune.artifact_format.verify import verify_artifact
from edgetune.durable import fsync_dir
from edgetune.errors import ArtifactError

DISK_MARGIN_BYTES = 16 << 20  # left free beyond a download and its unpacked files


@dataclass(frozen=True)
class Fetched:
    """A verified download, ready to install."""

    model: str
    version: int
    tarball: Path
    manifest: Manifest
    reused: bool  # an earlier complete download was reused
    resumed_from: int  # bytes of a partial download that were kept (0: none)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "version": self.version,
            "tarball": str(self.tarball),
            "reused": self.reused,
            "resumed_from": self.resumed_from,
        }


def fetch(root: Path, model: str, version: int | None = None, allow_downgrade: bool = False) -> Fetched:
    """The `fetch` verb: download and verify what the server offers (or `version`)."""
    installation = Installation.open(root)
    with installation.tree.locked():
        state = installation.recover()
        server = installation.server()
        offer = checked_offer(installation, server, model, version)
        return fetch_offer(installation, server, offer, state.get(model), allow_downgrade)


def fetch_offer(
    installation: Installation, server: ArtifactServer, offer: Offer, state: ModelState | None, allow_downgrade: bool
) -> Fetched:
    """Steps 2-4 of the module docstring for a `checked_offer` (the caller holds the lock)."""
    refuse_downgrade(state, offer.version, allow_downgrade)
    key = installation.trusted().artifact_key
    manifest_bytes = server.get_bytes(offer.manifest_url)
    if sha256_hex(manifest_bytes) != offer.manifest_sha256:
        raise AgentError(f"{offer.manifest_url}: its sha256 is not the one the offer announced; refused")
    signature_bytes = server.get_bytes(offer.signature_url)
    manifest = signed_manifest(key, manifest_bytes, signature_bytes)
    accept_manifest(installation.config, manifest, offer.model, offer.version)
    tarball = installation.tree.tarball(offer.model, offer.version)
    if tarball.exists():
        try:
            verify_download(key, tarball, manifest_bytes)
            return Fetched(offer.model, offer.version, tarball, manifest, reused=True, resumed_from=0)
        except ArtifactError:
            tarball.unlink()  # damaged, or of another signed manifest: download it again
    refuse_oversized(offer, manifest, (len(manifest_bytes), len(signature_bytes)))
    resumed_from = _download(installation.tree, server, offer, manifest)
    try:
        verify_download(key, tarball, manifest_bytes)
    except ArtifactError:
        tarball.unlink()  # never resume from a file that failed verification
        raise
    return Fetched(offer.model, offer.version, tarball, manifest, reused=False, resumed_from=resumed_from)


def _download(tree: FileTree, server: ArtifactServer, offer: Offer, manifest: Manifest) -> int:
    """Download (or resume) the offered tarball to its `.part`, then rename it complete;
    returns the bytes that were already there."""
    tree.downloads.mkdir(parents=True, exist_ok=True)
    partial, etag = tree.partial(offer.model, offer.version), tree.partial_etag(offer.model, offer.version)
    _remove_stale_partials(tree, offer)
    refuse_without_room(tree, offer, manifest)
    progress = server.download(offer.tarball_url, partial, etag, offer.tarball_size)
    tarball = tree.tarball(offer.model, offer.version)
    os.replace(partial, tarball)
    fsync_dir(tarball.parent)
    etag.unlink(missing_ok=True)
    return progress.resumed_from


def _remove_stale_partials(tree: FileTree, offer: Offer) -> None:
    """Partial downloads of the model's other versions, and of this one if it cannot be resumed
    (no ETag kept beside it, or longer than the offered tarball), are of no use."""
    tree.remove_other_partials(offer.model, offer.version)
    partial, etag = tree.partial(offer.model, offer.version), tree.partial_etag(offer.model, offer.version)
    if partial.exists() and (not etag.exists() or partial.stat().st_size > offer.tarball_size):
        partial.unlink()
        etag.unlink(missing_ok=True)


def refuse_oversized(offer: Offer, manifest: Manifest, head_sizes: tuple[int, int]) -> None:
    """The offered tarball can be no larger than the signed manifest's files packed."""
    bound = packed_size_bound(manifest.files, head_sizes)
    if offer.tarball_size > bound:
        raise AgentError(
            f"{offer.tarball_url}: offered as {offer.tarball_size} bytes, more than the {bound} its "
            "signed manifest's files can pack into; refused before downloading it"
        )


def refuse_without_room(tree: FileTree, offer: Offer, manifest: Manifest) -> None:
    """The agent root's filesystem must hold the rest of the download, its unpacked files and
    `DISK_MARGIN_BYTES`; refused before the first byte otherwise."""
    partial = tree.partial(offer.model, offer.version)
    to_download = offer.tarball_size - (partial.stat().st_size if partial.exists() else 0)
    unpacked = sum(entry.size for entry in manifest.files)
    needed, free = to_download + unpacked + DISK_MARGIN_BYTES, shutil.disk_usage(tree.downloads).free
    if needed > free:
        raise AgentError(
            f"{tree.root}: its filesystem has {free} bytes free; v{offer.version} of {offer.model} needs {needed} "
            f"({to_download} to download, {unpacked} unpacked, {DISK_MARGIN_BYTES} to spare): refused before "
            f"downloading; free some space there (old downloads are in {tree.downloads}), then run again"
        )


def checked_offer(installation: Installation, server: ArtifactServer, model: str, version: int | None) -> Offer:
    """Step 1: the server's offer, if its signed decision is for this board, its class, the
    model asked and the version asked (if one was), made for this request (it echoes the random
    nonce sent with it), and what the offer says. The caller
    holds the board's lock (the decision's serial is recorded)."""
    config = installation.config
    nonce = secrets.token_hex(16)
    offer = server.offer(config.board, check_model_name(model), version, nonce)
    asked = Asked(config.board, config.device_class, model, version, last_decision_serial(installation.tree), nonce)
    now = time.time()
    trusted = installation.trusted(offer.trust, now)
    try:
        decision = check_decision(trusted.decision_key(now), offer.decision, offer.decision_signature, asked, now)
        trusted.refuse_late(decision)
    except ArtifactError as err:
        raise AgentError(str(err)) from None
    refuse_unsigned_change(offer, decision)
    record_decision_serial(installation.tree, decision.serial)
    return offer


def refuse_unsigned_change(offer: Offer, decision: Decision) -> None:
    """Every field of the offer the agent acts on must be its signed decision's."""
    for name in ("board", "device_class", "model", "version", "pinned", "manifest_sha256", "tarball_size"):
        said, signed = getattr(offer, name), getattr(decision, name)
        if said != signed:
            raise AgentError(
                f"the offer's {name} {said!r} is not its signed decision's {signed!r} (rewritten on the way); refused"
            )


def refuse_downgrade(state: ModelState | None, version: int, allow_downgrade: bool) -> None:
    if state is not None and version < state.highest_installed and not allow_downgrade:
        raise AgentError(
            f"v{version} is older than v{state.highest_installed}, the newest version installed here: refused "
            "(a replayed old artifact must not downgrade the board); to go back, use `rollback` "
            "or install with --allow-downgrade"
        )


def signed_manifest(key: Ed25519PublicKey, manifest_bytes: bytes, signature_bytes: bytes) -> Manifest:
    """The manifest, if `signature_bytes` is the pinned key's signature of exactly these bytes."""
    problem = signature_problem(key, manifest_bytes, Signature.from_bytes(signature_bytes, SIGNATURE_NAME))
    if problem:
        raise AgentError(f"{MANIFEST_NAME}: {problem}; refused")
    return Manifest.from_bytes(manifest_bytes)


def accept_manifest(config: AgentConfig, manifest: Manifest, model: str, version: int | None) -> None:
    """The manifest must be for this board's class, the model asked and the version expected."""
    inputs = manifest.inputs
    if inputs.device_class != config.device_class:
        raise AgentError(
            f"the artifact is for class {inputs.device_class}, this board is of class {config.device_class}; refused"
        )
    if inputs.model != model:
        raise AgentError(f"the artifact is of model {inputs.model}, not {model}; refused")
    if version is not None and manifest.version != version:
        raise AgentError(f"the artifact is v{manifest.version}, the server offered v{version}; refused")


def verify_download(key: Ed25519PublicKey, tarball: Path, manifest_bytes: bytes) -> Manifest:
    """The tarball intact and signed by `key`, and its manifest the signed one fetched."""
    inner = verify_artifact(tarball, key)
    if inner.to_bytes() != manifest_bytes:
        raise ArtifactError(f"{tarball.name}: its manifest is not the signed manifest the server announced; refused")
    return inner


@dataclass(frozen=True)
class SerialReset:
    """What `reset-serial` did (the host reads it as JSON)."""

    board: str
    previous: int  # the highest serial accepted before
    last_serial: int  # the highest serial accepted now


def reset_serial(root: Path, serial: int) -> SerialReset:
    """The `reset-serial` verb: make `serial` the highest decision serial this board accepted
    (the operator's recovery after a serial far ahead: `edgetune fleet reset-serial`)."""
    installation = Installation.open(root)
    with installation.tree.locked():
        previous = last_decision_serial(installation.tree)
        record_decision_serial(installation.tree, serial)
    return SerialReset(installation.config.board, previous, serial)
