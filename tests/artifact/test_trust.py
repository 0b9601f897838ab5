"""The board's check of the fleet's keys (`artifact_format.trust.accept_trust`): a history from the
pinned anchor, each step signed by the key before it, never forked or rewound; revocations that
only grow; a decision key certified for a time."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetune.artifact_format.decision import new_decision
from edgetune.artifact_format.signing import key_id
from edgetune.artifact_format.trust import (
    ARTIFACT,
    DECISION,
    TRUST_SCHEMA,
    Revoked,
    Signed,
    TrustError,
    TrustFile,
    accept_trust,
    key_statement,
    raw_text,
    revocations_statement,
)
from edgetune.errors import ArtifactError

NOW = 1_800_000_000.0
DAY = 86400.0


def history(length: int) -> tuple[list[Ed25519PrivateKey], TrustFile]:
    """`length` artifact keys, the first the anchor, and a trust file whose decision key is
    certified by the last for 90 days."""
    keys = [Ed25519PrivateKey.generate() for _ in range(length)]
    rotations = tuple(key_statement(old, ARTIFACT, new.public_key(), NOW) for old, new in zip(keys, keys[1:]))
    decision = key_statement(keys[-1], DECISION, Ed25519PrivateKey.generate().public_key(), NOW, NOW + 90 * DAY)
    return keys, TrustFile(TRUST_SCHEMA, 1, raw_text(keys[0].public_key()), rotations, decision)


def test_a_board_follows_the_history_from_its_anchor():
    keys, trust = history(4)
    trusted = accept_trust(keys[0].public_key(), trust, None, NOW)
    assert key_id(trusted.artifact_key) == key_id(keys[-1].public_key())
    assert [key_id(k) for k in trusted.release_keys] == [key_id(k.public_key()) for k in keys]
    assert trusted.decision_key(NOW + 89 * DAY) is not None
    with pytest.raises(TrustError, match="past by this board's clock"):
        trusted.decision_key(NOW + 91 * DAY)
    late = new_decision(
        board="b",
        device_class="c",
        model="m",
        version=1,
        manifest_sha256="0" * 64,
        tarball_size=1,
        pinned=False,
        requested=False,
        serial=1,
        issued_at=NOW + 91 * DAY,
        ttl_s=60,
    )
    with pytest.raises(TrustError, match="past by the decision's signing time"):
        trusted.refuse_late(late)


def test_another_fleets_history_a_forged_step_a_fork_and_a_rewind_are_refused():
    keys, trust = history(3)
    anchor = keys[0].public_key()
    with pytest.raises(TrustError, match="another fleet"):
        accept_trust(Ed25519PrivateKey.generate().public_key(), trust, None, NOW)
    thief = Ed25519PrivateKey.generate()
    forged = replace(trust, rotations=(trust.rotations[0], key_statement(thief, ARTIFACT, thief.public_key(), NOW)))
    with pytest.raises(TrustError, match="rotations\\[1\\]"):
        accept_trust(anchor, forged, None, NOW)
    fork = replace(
        trust, rotations=(trust.rotations[0], key_statement(keys[1], ARTIFACT, thief.public_key(), NOW)), decision=None
    )
    accept_trust(anchor, fork, None, NOW)  # valid alone: keys[1] signed it
    with pytest.raises(TrustError, match="does not extend"):
        accept_trust(anchor, fork, trust, NOW)  # but not for a board that took the real history
    with pytest.raises(TrustError, match="does not extend"):
        accept_trust(anchor, replace(trust, rotations=trust.rotations[:1]), trust, NOW)


def test_revocations_only_grow_and_a_revoked_newest_key_is_refused():
    keys, trust = history(2)
    anchor, newest = keys[0].public_key(), keys[-1]
    first = replace(
        trust, revocations=revocations_statement(newest, 2, (Revoked(key_id(anchor), "2027-06-01T00:00:00Z"),), NOW)
    )
    taken = accept_trust(anchor, first, None, NOW)
    assert len(taken.release_keys) == 2  # the anchor is refused only from its date
    assert len(accept_trust(anchor, first, None, NOW + 365 * DAY).release_keys) == 1
    older = replace(trust, revocations=revocations_statement(newest, 1, (), NOW))
    with pytest.raises(TrustError, match="older than the ones this board took"):
        accept_trust(anchor, older, first, NOW)
    with pytest.raises(TrustError, match="older than the ones this board took"):
        accept_trust(anchor, trust, first, NOW)  # none at all, after some were taken
    self_revoked = replace(
        trust,
        revocations=revocations_statement(
            newest, 3, (Revoked(key_id(newest.public_key()), "2020-01-01T00:00:00Z"),), NOW
        ),
    )
    with pytest.raises(TrustError, match="artifact key .* is revoked"):
        accept_trust(anchor, self_revoked, first, NOW)
    by_old_key = replace(trust, revocations=revocations_statement(keys[0], 5, (), NOW))
    with pytest.raises(TrustError, match="revocations: signed by key"):
        accept_trust(anchor, by_old_key, None, NOW)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_changed_character_of_a_signed_statement_is_refused(data):
    keys, trust = history(2)
    trust = replace(trust, revocations=revocations_statement(keys[-1], 1, (), NOW))
    which = data.draw(st.sampled_from(["rotation", "decision", "revocations"]))
    signed = {"rotation": trust.rotations[0], "decision": trust.decision, "revocations": trust.revocations}[which]
    at = data.draw(st.integers(0, len(signed.text) - 1))
    char = data.draw(st.characters(codec="utf-8").filter(lambda c: c != signed.text[at]))
    changed = Signed(signed.text[:at] + char + signed.text[at + 1 :], signed.signature)
    tampered = {
        "rotation": replace(trust, rotations=(changed,)),
        "decision": replace(trust, decision=changed),
        "revocations": replace(trust, revocations=changed),
    }[which]
    with pytest.raises(ArtifactError):
        accept_trust(keys[0].public_key(), tampered, None, NOW)
