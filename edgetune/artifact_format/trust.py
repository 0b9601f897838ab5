"""The fleet's keys by role, and the check a board makes of them before trusting any.

Roles (TUF's, small):
- the artifact key (offline: `build` and `keys` use it, `serve` never reads it) signs manifests,
  the store's index, and the statements below. A board pins the fleet's first artifact key
  (`fleet.pub`, the anchor) and follows its rotations.
- the decision key (online: `serve`'s) signs decisions only, for as long as the artifact key's
  certificate of it says.

Statements, canonical JSON each, travelling as `{"text", "signature"}` (`manifest.sig` format):
- `edgetune.key-statement` v1 `{"schema", "schema_version", "role", "key", "key_id",
  "issuer_key_id", "issued", "expires"}`, `key` the raw ed25519 public key in base64. Role
  `artifact`: the issuer's successor, signed by the issuer (the artifact key before it;
  `expires` null). Role `decision`: the key the artifact key `issuer_key_id` lets sign
  decisions until `expires`.
- `edgetune.key-revocations` v1 `{"schema", "schema_version", "serial", "issued", "revoked":
  [{"key_id", "refused_from"}]}`, signed by the newest artifact key: keys refused from a time on.

The trust file (`edgetune.trust` v1 `{"schema", "schema_version", "anchor", "rotations",
"decision", "revocations"}`) carries them all; the server sends it with every offer and the
rollout writes it on boards. A board takes one (`accept_trust`) only if it starts at its pinned
anchor, every rotation is signed by the key before it, its rotations extend the ones the board
took before (a stolen old key cannot fork the history), its revocations are signed by the
newest artifact key with a serial not below the last taken, and the newest key is not revoked.
The decision key is then usable (`Trusted.decision_key`) while its certificate, signed by the
newest artifact key, has not expired (by the board's clock and the decision's time) and it is
not revoked. Downloads must be signed by the newest artifact key; releases already installed
by any artifact key of the history not revoked.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgetune.artifact_format.codec import canonical_bytes, load_versioned, rule
from edgetune.artifact_format.decision import Decision, parse_utc, utc_text
from edgetune.artifact_format.signing import Signature, key_id, sign, signature_problem
from edgetune.errors import ArtifactError

TRUST_SCHEMA, STATEMENT_SCHEMA, REVOCATIONS_SCHEMA = (
    "edgetune.trust",
    "edgetune.key-statement",
    "edgetune.key-revocations",
)
ARTIFACT, DECISION = "artifact", "decision"
MAX_ROTATIONS = 256
MAX_REVOKED = 4096


class TrustError(ArtifactError):
    """Keys a board must not trust; the message says why."""


@dataclass(frozen=True)
class Signed:
    """A statement's canonical text and its signature."""

    text: str
    signature: Signature


@dataclass(frozen=True)
class KeyStatement:
    schema: str
    schema_version: int
    role: str = rule(allowed=(ARTIFACT, DECISION))
    key: str = rule()  # base64 of the raw ed25519 public key
    key_id: str = rule()
    issuer_key_id: str = rule()
    issued: str = rule()
    expires: str | None = None  # a decision key's certificate ends then; an artifact key's succession never

    @classmethod
    def from_text(cls, text: str, where: str) -> KeyStatement:
        statement = load_versioned(cls, text.encode("utf-8"), where, STATEMENT_SCHEMA, 1, "statement", TrustError)
        if key_id(statement.public_key()) != statement.key_id:
            raise TrustError(f"{where}: key_id {statement.key_id} is not the id of its key")
        return statement

    def public_key(self) -> Ed25519PublicKey:
        return raw_public_key(self.key, "a key statement")


@dataclass(frozen=True)
class Revoked:
    key_id: str
    refused_from: str  # UTC: signatures by the key are refused from then on


@dataclass(frozen=True)
class Revocations:
    schema: str
    schema_version: int
    serial: int = rule(minimum=0)
    issued: str = rule()
    revoked: tuple[Revoked, ...] = rule((), max_items=MAX_REVOKED)

    def refused_since(self, kid: str) -> float | None:
        times = [parse_utc(entry.refused_from) for entry in self.revoked if entry.key_id == kid]
        return min(times) if times else None


@dataclass(frozen=True)
class TrustFile:
    schema: str
    schema_version: int
    anchor: str  # base64 of the raw public key boards pin (`fleet.pub`): the first artifact key
    rotations: tuple[Signed, ...] = rule((), max_items=MAX_ROTATIONS)
    decision: Signed | None = None
    revocations: Signed | None = None

    def to_bytes(self) -> bytes:
        return canonical_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> TrustFile:
        return load_versioned(cls, data, where, TRUST_SCHEMA, 1, "trust file", TrustError)


@dataclass(frozen=True)
class Trusted:
    """What a board trusts after `accept_trust`."""

    artifact_key: Ed25519PublicKey  # the newest: downloads must be signed by it
    release_keys: tuple[Ed25519PublicKey, ...]  # every artifact key of the history not revoked
    decision: KeyStatement | None
    revocations: Revocations | None

    def decision_key(self, now: float) -> Ed25519PublicKey:
        """The decision key, if its certificate holds at `now` (the board's clock)."""
        cert = self._decision_certificate()
        self._refuse_after_expiry(now, "this board's clock")
        self.refuse_revoked(cert.key_id, "decision key", now)
        return cert.public_key()

    def refuse_late(self, decision: Decision) -> None:
        """A decision signed after its key's certificate ended is refused."""
        self._refuse_after_expiry(parse_utc(decision.issued), "the decision's signing time")

    def _decision_certificate(self) -> KeyStatement:
        if self.decision is None:
            raise TrustError(
                "the server's trust file certifies no decision key (run `edgetune keys init` on the "
                "host with the artifact key); refused"
            )
        return self.decision

    def _refuse_after_expiry(self, moment: float, whose: str) -> None:
        cert = self._decision_certificate()
        if moment > parse_utc(cert.expires or ""):
            raise TrustError(
                f"the decision key {cert.key_id} was certified until {cert.expires}, past by {whose} "
                f"({utc_text(moment)}): run `edgetune keys rotate decision` on the host; refused"
            )

    def refuse_revoked(self, kid: str, what: str, now: float) -> None:
        since = self.revocations.refused_since(kid) if self.revocations else None
        if since is not None and now >= since:
            raise TrustError(f"the {what} {kid} is revoked since {utc_text(since)}; refused")


def raw_public_key(text: str, where: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        raise TrustError(f"{where}: {text[:60]!r} is not a base64 ed25519 public key") from None


def raw_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def signed_statement(signer: Ed25519PrivateKey, statement: KeyStatement | Revocations) -> Signed:
    data = canonical_bytes(statement)
    return Signed(data.decode("utf-8"), sign(signer, data))


def key_statement(
    signer: Ed25519PrivateKey, role: str, key: Ed25519PublicKey, issued_at: float, expires_at: float | None = None
) -> Signed:
    statement = KeyStatement(
        STATEMENT_SCHEMA,
        1,
        role,
        raw_text(key),
        key_id(key),
        key_id(signer.public_key()),
        utc_text(issued_at),
        None if expires_at is None else utc_text(expires_at),
    )
    return signed_statement(signer, statement)


def revocations_statement(
    signer: Ed25519PrivateKey, serial: int, revoked: tuple[Revoked, ...], issued_at: float
) -> Signed:
    return signed_statement(signer, Revocations(REVOCATIONS_SCHEMA, 1, serial, utc_text(issued_at), revoked))


def read_revocations(signed: Signed, key: Ed25519PublicKey) -> Revocations:
    _check_signed(signed, key, "revocations")
    return load_versioned(
        Revocations, signed.text.encode("utf-8"), "revocations", REVOCATIONS_SCHEMA, 1, "statement", TrustError
    )


def read_statement(signed: Signed, key: Ed25519PublicKey, role: str, where: str) -> KeyStatement:
    _check_signed(signed, key, where)
    statement = KeyStatement.from_text(signed.text, where)
    if statement.role != role or statement.issuer_key_id != key_id(key):
        raise TrustError(
            f"{where}: a {statement.role} key statement by {statement.issuer_key_id}, "
            f"not a {role} key statement by {key_id(key)}"
        )
    if role == DECISION:
        try:
            parse_utc(statement.expires or "")
        except ArtifactError:
            raise TrustError(
                f"{where}: expires {statement.expires!r} is not a UTC time: a decision key is certified until one"
            ) from None
    return statement


def _check_signed(signed: Signed, key: Ed25519PublicKey, where: str) -> None:
    problem = signature_problem(key, signed.text.encode("utf-8"), signed.signature, where)
    if problem:
        raise TrustError(f"{where}: {problem}")


def artifact_history(trust: TrustFile) -> list[Ed25519PublicKey]:
    """The anchor, then each rotation's key, every step signed by the key before it."""
    keys = [raw_public_key(trust.anchor, "the trust file's anchor")]
    for i, signed in enumerate(trust.rotations):
        keys.append(read_statement(signed, keys[-1], ARTIFACT, f"rotations[{i}]").public_key())
    return keys


def accept_trust(anchor: Ed25519PublicKey, offered: TrustFile, accepted: TrustFile | None, now: float) -> Trusted:
    """What a board trusts, from the `offered` trust file, given its pinned `anchor` and the file
    it `accepted` before (None: none); a TrustError if it must not take it (module docstring)."""
    if offered.anchor != raw_text(anchor):
        raise TrustError(
            f"its history starts at key {key_id(raw_public_key(offered.anchor, 'anchor'))}, this board "
            f"pins {key_id(anchor)} (a trust file of another fleet); refused"
        )
    if accepted is not None and offered.rotations[: len(accepted.rotations)] != accepted.rotations:
        raise TrustError(
            f"its key history ({len(offered.rotations)} rotations) does not extend the one this board "
            f"took ({len(accepted.rotations)} rotations): a forked or older history; refused"
        )
    history = artifact_history(offered)
    newest = history[-1]
    revocations = read_revocations(offered.revocations, newest) if offered.revocations else None
    taken = accepted_revocation_serial(accepted)
    if (revocations.serial if revocations else 0) < taken:
        raise TrustError(
            f"its revocations (serial {revocations.serial if revocations else 0}) are older than the "
            f"ones this board took (serial {taken}); refused"
        )
    decision = read_statement(offered.decision, newest, DECISION, "decision") if offered.decision else None
    trusted = Trusted(newest, (), decision, revocations)
    trusted.refuse_revoked(key_id(newest), "artifact key", now)
    release_keys = tuple(k for k in history if not _revoked_at(trusted, k, now))
    return Trusted(newest, release_keys, decision, revocations)


def accepted_revocation_serial(accepted: TrustFile | None) -> int:
    """The serial of the revocations in the file a board took (it checked them then)."""
    if accepted is None or accepted.revocations is None:
        return 0
    return read_revocations(accepted.revocations, artifact_history(accepted)[-1]).serial


def _revoked_at(trusted: Trusted, key: Ed25519PublicKey, now: float) -> bool:
    since = trusted.revocations.refused_since(key_id(key)) if trusted.revocations else None
    return since is not None and now >= since


def anchor_pem(trust: TrustFile) -> bytes:
    """The PEM boards pin for this trust file: its anchor key."""
    return raw_public_key(trust.anchor, "anchor").public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
