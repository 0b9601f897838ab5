"""Signed decisions: which version of a model one board should run, signed, expiring, numbered.

A signed manifest says what an artifact is; a decision says which artifact a board should run.
The artifact server answers a board's "which version?" with a `Decision`, canonical JSON
(schema `edgetune.decision` version 1):
`{"schema", "schema_version", "board", "device_class", "model", "version", "manifest_sha256",
"tarball_size", "pinned", "requested", "issued", "expires", "serial", "nonce"}`
and its ed25519 signature by the fleet signing key (the `manifest.sig` format). `requested` is
true when the board asked for that very version (a rollout, a rollback), false when it asked
for its assignment (its pin, else the newest). `serial` grows with every decision the host
signs, across server restarts, and never runs more than a day ahead of `issued`. `nonce` is the
random value the board sent with its request (absent in decisions of requests without one).

The board acts on nothing else (`check_decision`): the signature must be the pinned key's over
exactly these bytes, the decision for this board, its class and the model (and version) asked,
made for this very request (its nonce echoed; a request without one: not expired by the board's
clock), and its serial above every serial the board has seen and within a day of its signing
time. So a man in the middle can neither rewrite an answer, nor replay an older one, nor hold
one back, and a board's clock, ahead or behind, decides nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgetune.artifact_format.codec import added_field, canonical_bytes, load_versioned
from edgetune.artifact_format.signing import Signature, sign, signature_problem
from edgetune.errors import ArtifactError

DECISION_SCHEMA = "edgetune.decision"
DECISION_SCHEMA_VERSION = 1
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class DecisionError(ArtifactError):
    """A decision the board must not act on; the message says why."""


# How far a serial may run ahead of its decision's signing time, in milliseconds: one more than
# the last serial runs ahead only by the decisions signed within one millisecond.
MAX_SERIAL_LEAD_MS = 86_400_000
NONCE = re.compile(r"[0-9a-f]{32}")  # what a board sends with its request, echoed in the decision


@dataclass(frozen=True)
class Decision:
    schema: str
    schema_version: int
    board: str
    device_class: str
    model: str
    version: int
    manifest_sha256: str  # of the version's manifest.json, as the store's signed index lists it
    tarball_size: int
    pinned: bool  # the version is the inventory's pin for this board or its class
    requested: bool  # the board asked for this version (not for its assignment)
    issued: str  # UTC, TIME_FORMAT
    expires: str  # UTC, TIME_FORMAT: not to be acted on after this
    serial: int  # above every serial the host signed before
    nonce: str | None = added_field()  # the board's request's, echoed: this answer was made for it

    def to_bytes(self) -> bytes:
        return canonical_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> Decision:
        return load_versioned(cls, data, "decision", DECISION_SCHEMA, DECISION_SCHEMA_VERSION, "record")


@dataclass(frozen=True)
class Asked:
    """What the board asked, and what it has seen: the decision must answer exactly this."""

    board: str
    device_class: str
    model: str
    version: int | None  # None: the board's assignment
    last_serial: int  # the highest serial this board accepted before (0: none)
    nonce: str | None = None  # sent with the request: the decision must echo it


def new_decision(
    *,
    board: str,
    device_class: str,
    model: str,
    version: int,
    manifest_sha256: str,
    tarball_size: int,
    pinned: bool,
    requested: bool,
    serial: int,
    issued_at: float,
    ttl_s: float,
    nonce: str | None = None,
) -> Decision:
    return Decision(
        DECISION_SCHEMA,
        DECISION_SCHEMA_VERSION,
        board,
        device_class,
        model,
        version,
        manifest_sha256,
        tarball_size,
        pinned,
        requested,
        utc_text(issued_at),
        utc_text(issued_at + ttl_s),
        serial,
        nonce,
    )


def sign_decision(key: Ed25519PrivateKey, decision: Decision) -> tuple[str, Signature]:
    """The decision's canonical text and its signature (what travels in the offer)."""
    data = decision.to_bytes()
    return data.decode("utf-8"), sign(key, data)


def check_decision(key: Ed25519PublicKey, text: str, signature: Signature, asked: Asked, now: float) -> Decision:
    """The decision in `text`, if the board may act on it (see the module docstring)."""
    data = text.encode("utf-8")
    problem = signature_problem(key, data, signature, "decision")
    if problem:
        raise DecisionError(f"the server's decision: {problem}; refused")
    decision = Decision.from_bytes(data)
    problem = _answer_problem(decision, asked) or _freshness_problem(decision, asked, now)
    if problem:
        raise DecisionError(f"the server's decision (serial {decision.serial}): {problem}; refused")
    return decision


def _answer_problem(decision: Decision, asked: Asked) -> str | None:
    """None if `decision` answers what the board asked, else how it does not."""
    if (decision.board, decision.device_class) != (asked.board, asked.device_class):
        return (
            f"it is for board {decision.board} of class {decision.device_class}, "
            f"this is {asked.board} of class {asked.device_class}"
        )
    if decision.model != asked.model:
        return f"it is for model {decision.model}, not {asked.model}"
    if asked.version is not None and (not decision.requested or decision.version != asked.version):
        return f"it names v{decision.version} of {decision.model}, the board asked for v{asked.version}"
    if asked.version is None and decision.requested:
        return (
            f"it answers a request for v{decision.version}, not for the version this board should run "
            "(another answer put in place of this one)"
        )
    return None


def serial_lead_problem(serial: int, issued_at: float) -> str | None:
    """Why `serial` is no serial an honest signer makes at `issued_at` (None: it is one). Serials
    are the signing time in milliseconds, or one more than the last one: far above the time, a
    key holder or a clock that once ran ahead made it, and a board that took it would refuse
    every later decision."""
    lead_ms = serial - issued_at * 1000
    if lead_ms > MAX_SERIAL_LEAD_MS:
        return (
            f"serial {serial} is {lead_ms / 86_400_000:.1f} days ahead of its signing time "
            f"{utc_text(issued_at)} (at most {MAX_SERIAL_LEAD_MS // 86_400_000} allowed)"
        )
    return None


def _freshness_problem(decision: Decision, asked: Asked, now: float) -> str | None:
    """None if `decision` was made for this very request (it echoes the request's nonce; without
    one: it has not expired by the board's clock), is not older than one the board has seen, and
    its serial is one its signing time allows."""
    lead = serial_lead_problem(decision.serial, parse_utc(decision.issued))
    if lead:
        return lead
    if asked.nonce is not None:
        if decision.nonce != asked.nonce:
            return (
                f"it echoes nonce {decision.nonce}, not this request's {asked.nonce} (an answer made for "
                "another request: replayed or held back)"
            )
    elif now > parse_utc(decision.expires):
        return f"expired at {decision.expires} (it is {utc_text(now)} here; a stale or delayed answer)"
    if decision.serial <= asked.last_serial:
        return f"serial {decision.serial} is not above the last seen {asked.last_serial} (a replayed older answer)"
    return None


def utc_text(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime(TIME_FORMAT)


def parse_utc(text: str) -> float:
    try:
        return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise DecisionError(
            f"the server's decision: {text[:40]!r} is not a UTC time ({TIME_FORMAT}); refused"
        ) from None
