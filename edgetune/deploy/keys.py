"""The fleet's keys by role on the host (`artifact_format.trust`): the decision key `serve` signs
with, the trust file that certifies it, and the rotation and revocation of each.

Files in the keys directory (the signing key's): `decision.key` (mode 0600, the online key:
`serve` reads it and never the artifact key) and `trust.json` (public: the anchor, the artifact
key's rotations, the decision key's certificate, the revocations; `serve` sends it with every
offer and the rollout writes it on boards). Everything here but `OnlineKeys` needs the artifact
key: run it where that key is kept.

Rotating the artifact key writes the successor to `<signing key>.next` first, then the trust
file naming it, then signs the store again, then moves the successor into place: an
interrupted rotation is finished by running it again.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.decision import parse_utc, utc_text
from edgetune.artifact_format.signing import key_id, load_private_key
from edgetune.artifact_format.trust import (
    ARTIFACT,
    DECISION,
    TRUST_SCHEMA,
    Revoked,
    TrustError,
    TrustFile,
    artifact_history,
    key_statement,
    raw_text,
    read_revocations,
    read_statement,
    revocations_statement,
)
from edgetune.durable import write_atomic
from edgetune.errors import DeployError
from edgetune.inventory.schema import Fleet

log = logging.getLogger(__name__)

DECISION_KEY_NAME, TRUST_NAME = "decision.key", "trust.json"
DECISION_CERT_DAYS = 90  # how long the artifact key certifies a decision key
RENEW_BELOW_DAYS = 30  # `keys init --if-missing` certifies it again when less is left
WARN_BELOW_DAYS = 14  # `serve` warns when less is left
DAY_S = 86400.0
KEYS_INIT_HINT = "run `edgetune keys init --if-missing -f {fleet}` where the artifact key is kept"


@dataclass(frozen=True)
class KeyFiles:
    signing_key: Path  # the artifact key (offline)
    public_key: Path
    decision_key: Path  # the decision key (online)
    trust: Path

    @classmethod
    def of(cls, fleet: Fleet) -> KeyFiles:
        artifacts = fleet.artifacts
        keys = artifacts.signing_key.parent
        return cls(artifacts.signing_key, artifacts.public_key, keys / DECISION_KEY_NAME, keys / TRUST_NAME)

    @property
    def next_signing_key(self) -> Path:
        return self.signing_key.with_name(self.signing_key.name + ".next")


def read_trust(path: Path) -> TrustFile:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DeployError(
            f"no trust file at {path}: run `edgetune keys init --if-missing` where the artifact key is kept"
        ) from None
    except OSError as err:
        raise DeployError(f"cannot read the trust file {path}: {err.strerror}") from None
    try:
        trust = TrustFile.from_bytes(data, str(path))
        artifact_history(trust)
    except TrustError as err:
        raise DeployError(str(err)) from None
    return trust


def _write_private(path: Path, key: Ed25519PrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, pem, mode=0o600)


def _write_public(path: Path, key: Ed25519PrivateKey) -> None:
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    write_atomic(path, pem, mode=0o644)


class OfflineKeys:
    """The trust file and the keys it names, with the artifact key in hand."""

    def __init__(self, fleet: Fleet):
        self.fleet, self.files = fleet, KeyFiles.of(fleet)
        self._finish_rotation()
        self.artifact = load_private_key(self.files.signing_key)
        self.trust = self._load_or_start()

    def _load_or_start(self) -> TrustFile:
        if not self.files.trust.exists():
            return TrustFile(TRUST_SCHEMA, 1, raw_text(self.artifact.public_key()))
        trust = read_trust(self.files.trust)
        newest = key_id(artifact_history(trust)[-1])
        if newest != key_id(self.artifact.public_key()):
            raise DeployError(
                f"the signing key {self.files.signing_key} (key {key_id(self.artifact.public_key())}) is "
                f"not the newest artifact key of {self.files.trust} ({newest}): the keys directory "
                "mixes two fleets' files, or a rotation was undone by hand"
            )
        return trust

    def _finish_rotation(self) -> None:
        """A rotation interrupted after its trust file was written is completed; one interrupted
        before is forgotten (its successor key was never named anywhere)."""
        pending = self.files.next_signing_key
        if not pending.exists():
            return
        successor = load_private_key(pending)
        if self.files.trust.exists() and key_id(artifact_history(read_trust(self.files.trust))[-1]) == key_id(
            successor.public_key()
        ):
            log.warning("finishing the interrupted rotation of the artifact key to %s", key_id(successor.public_key()))
            self._install_artifact_key(successor)
        else:
            pending.unlink()

    def _install_artifact_key(self, key: Ed25519PrivateKey) -> None:
        ArtifactStore(self.fleet.artifacts.dir).resign(key)
        os.replace(self.files.next_signing_key, self.files.signing_key)
        _write_public(self.files.public_key, key)

    # -- the decision key

    def decision_certificate_left_s(self, now: float) -> float:
        """Seconds the decision key's certificate has left (0: none, or not the newest artifact key's)."""
        if self.trust.decision is None or not self.files.decision_key.exists():
            return 0.0
        try:
            cert = read_statement(self.trust.decision, self.artifact.public_key(), DECISION, "decision")
        except TrustError:
            return 0.0
        decision = load_private_key(self.files.decision_key)
        if cert.key_id != key_id(decision.public_key()):
            return 0.0
        return max(0.0, parse_utc(cert.expires or "") - now)

    def ensure_decision_key(self, now: float) -> str:
        """Make the decision key if there is none, and certify it again if its certificate has
        less than RENEW_BELOW_DAYS left; what was done, as a line."""
        left = self.decision_certificate_left_s(now)
        if left >= RENEW_BELOW_DAYS * DAY_S:
            return f"keeping the decision key {self.files.decision_key} (certified for {left / DAY_S:.0f} more days)"
        if not self.files.decision_key.exists():
            _write_private(self.files.decision_key, Ed25519PrivateKey.generate())
        self._certify(load_private_key(self.files.decision_key), now)
        return (
            f"decision key {self.files.decision_key} (mode 0600; `serve` signs decisions with it) certified "
            f"for {DECISION_CERT_DAYS} days in {self.files.trust}"
        )

    def _certify(self, decision: Ed25519PrivateKey, now: float) -> None:
        if key_id(decision.public_key()) == key_id(self.artifact.public_key()) or _same_file(
            self.files.decision_key, self.files.signing_key
        ):
            raise DeployError(f"the decision key {self.files.decision_key} is the artifact key: they must differ")
        cert = key_statement(self.artifact, DECISION, decision.public_key(), now, now + DECISION_CERT_DAYS * DAY_S)
        self._save(replace(self.trust, decision=cert))

    def rotate_decision(self, now: float, old_refused_from: float) -> list[str]:
        """A new decision key, certified; the old one revoked from `old_refused_from`."""
        lines = []
        if self.files.decision_key.exists():
            old = key_id(load_private_key(self.files.decision_key).public_key())
            self._revoke(old, old_refused_from, now)
            lines.append(f"decision key {old} refused from {utc_text(old_refused_from)}")
        _write_private(self.files.decision_key, Ed25519PrivateKey.generate())
        self._certify(load_private_key(self.files.decision_key), now)
        new = key_id(load_private_key(self.files.decision_key).public_key())
        return [
            f"new decision key {new} in {self.files.decision_key}, certified for {DECISION_CERT_DAYS} days; "
            "a running `serve` takes it at its next request",
            *lines,
        ]

    # -- the artifact key

    def rotate_artifact(self, now: float, old_refused_from: float | None) -> list[str]:
        """The artifact key's successor, certified by it; the decision certificate and the
        revocations signed again by the successor, the store signed again."""
        old, new = self.artifact, Ed25519PrivateKey.generate()
        _write_private(self.files.next_signing_key, new)
        rotations = (*self.trust.rotations, key_statement(old, ARTIFACT, new.public_key(), now))
        revoked = self._revoked()
        if old_refused_from is not None:
            revoked = (*revoked, Revoked(key_id(old.public_key()), utc_text(old_refused_from)))
        self.artifact = new
        trust = replace(self.trust, rotations=rotations)
        trust = replace(trust, revocations=self._revocations(revoked, now))
        if self.files.decision_key.exists():
            decision = load_private_key(self.files.decision_key)
            trust = replace(
                trust,
                decision=key_statement(new, DECISION, decision.public_key(), now, now + DECISION_CERT_DAYS * DAY_S),
            )
        self._save(trust)
        self._install_artifact_key(new)
        lines = [
            f"artifact key {key_id(old.public_key())} -> {key_id(new.public_key())} (in {self.files.signing_key}; "
            f"public {self.files.public_key}); the store is signed again by it; boards take it at their next "
            "download or rollout"
        ]
        if old_refused_from is not None:
            lines.append(f"artifact key {key_id(old.public_key())} refused from {utc_text(old_refused_from)}")
        return lines

    # -- revocations

    def revoke(self, kid: str, refused_from: float, now: float) -> str:
        if kid == key_id(self.artifact.public_key()):
            raise DeployError(
                f"{kid} is the newest artifact key: rotate it first (`edgetune keys rotate artifact --revoke-old`)"
            )
        self._revoke(kid, refused_from, now)
        return f"key {kid} refused from {utc_text(refused_from)} (in {self.files.trust}; boards take it at their next download or rollout)"

    def _revoke(self, kid: str, refused_from: float, now: float) -> None:
        revoked = tuple(r for r in self._revoked() if r.key_id != kid) + (Revoked(kid, utc_text(refused_from)),)
        self._save(replace(self.trust, revocations=self._revocations(revoked, now)))

    def _revoked(self) -> tuple[Revoked, ...]:
        if self.trust.revocations is None:
            return ()
        return read_revocations(self.trust.revocations, artifact_history(self.trust)[-1]).revoked

    def _revocations(self, revoked: tuple[Revoked, ...], now: float):
        serial = 0
        if self.trust.revocations is not None:
            serial = read_revocations(self.trust.revocations, artifact_history(self.trust)[-1]).serial
        return revocations_statement(self.artifact, serial + 1, revoked, now)

    def _save(self, trust: TrustFile) -> None:
        self.files.trust.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self.files.trust, trust.to_bytes(), mode=0o644)
        self.trust = trust


def ensure_decision_key(fleet: Fleet, now: float | None = None) -> str:
    """`keys init`'s part: the decision key and the trust file certifying it."""
    return OfflineKeys(fleet).ensure_decision_key(time.time() if now is None else now)


class OnlineKeys:
    """What `serve` signs with: the decision key and the trust file, read again when either file
    changes (a rotation takes effect at the next request); never the artifact key."""

    def __init__(self, fleet: Fleet):
        self.fleet, self.files = fleet, KeyFiles.of(fleet)
        self._seen: tuple | None = None
        self._keys: tuple[Ed25519PrivateKey, TrustFile] | None = None
        self.current()

    def current(self) -> tuple[Ed25519PrivateKey, TrustFile]:
        stamp = tuple(_stamp(p) for p in (self.files.decision_key, self.files.trust))
        if stamp != self._seen or self._keys is None:
            self._keys = self._load()
            self._seen = stamp
        return self._keys

    def _load(self) -> tuple[Ed25519PrivateKey, TrustFile]:
        hint = KEYS_INIT_HINT.format(fleet=self.fleet.path)
        if _same_file(self.files.decision_key, self.files.signing_key):
            raise DeployError(
                f"the decision key {self.files.decision_key} is the artifact signing key: `serve` "
                f"must not hold the key that signs code; {hint}"
            )
        if not self.files.decision_key.exists():
            raise DeployError(f"no decision key at {self.files.decision_key}: {hint}")
        decision, trust = load_private_key(self.files.decision_key), read_trust(self.files.trust)
        history = artifact_history(trust)
        if key_id(decision.public_key()) in {key_id(k) for k in history}:
            raise DeployError(
                f"the decision key {self.files.decision_key} is an artifact key: they must differ; {hint}"
            )
        try:
            cert = read_statement(trust.decision, history[-1], DECISION, "decision") if trust.decision else None
        except TrustError as err:
            raise DeployError(f"{self.files.trust}: {err}; {hint}") from None
        if cert is None or cert.key_id != key_id(decision.public_key()):
            raise DeployError(f"{self.files.trust} does not certify the decision key {self.files.decision_key}; {hint}")
        left_days = (parse_utc(cert.expires or "") - time.time()) / DAY_S
        if left_days <= 0:
            raise DeployError(f"the decision key's certificate ended at {cert.expires}; {hint}")
        if left_days < WARN_BELOW_DAYS:
            log.warning(
                "warning: the decision key's certificate ends at %s (%.1f days): %s", cert.expires, left_days, hint
            )
        return decision, trust


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False
