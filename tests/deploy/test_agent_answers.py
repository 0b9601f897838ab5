"""The agent's answers as the host reads them (`deploy.remote`): one versioned record per verb,
decoded into the agent's own record types, so a renamed or retyped field, another schema version
or another verb is an error naming the board, the verb and the field, never a silent `None`."""

from __future__ import annotations

import json

import pytest

from edgetune.agent.answer import ANSWER_SCHEMA, ANSWER_SCHEMA_VERSION, answer_json
from edgetune.agent.run_report import RunReport
from edgetune.agent.status import InstallationStatus, ModelStatus
from edgetune.deploy.remote import UnreadableAnswer, answer_of, record_of
from edgetune.errors import DeployError

REPORT = RunReport(
    "gw-1", "mlp", 3, "reference", {"output0": (1, 10)}, True, 1e-6, "", "2", 1, 6, 0, (0.001, 0.0011), 1.05
)
STATUS = InstallationStatus(
    "gw-1", "gw-fast", "fw 1.0", {"mlp": ModelStatus(3, "2026-12-01T10:00:00Z", "fw 1.0", 2, 3, (2, 3))}
)


def printed(verb: str, record: object) -> dict:
    """`record` as the agent prints its answer to `verb` (JSON, read back as plain data)."""
    return json.loads(json.dumps(answer_json(verb, record)))


def decoded(cls: type, verb: str, answer: dict, asked: str | None = None):
    return record_of(cls, "gw-1", asked or verb, answer_of("gw-1", asked or verb, json.dumps(answer)))


def test_answers_are_versioned_records_decoded_into_the_agents_own():
    assert printed("status", STATUS)["schema"] == ANSWER_SCHEMA and printed("status", STATUS)["schema_version"] == 1
    assert decoded(InstallationStatus, "status", printed("status", STATUS)) == STATUS
    assert decoded(RunReport, "run", printed("run", REPORT)) == REPORT


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: r.update(samples=r.pop("samples_s")), r"record.samples: unknown key \(did you mean 'samples_s'\?\)"),
        (lambda r: r.update(outputs_match="yes"), "record.outputs_match: must be true or false, got str 'yes'"),
        (lambda r: r.pop("median_ms"), "record.median_ms: required field is missing"),
    ],
)
def test_a_renamed_retyped_or_missing_field_is_refused_by_name(change, named):
    answer = printed("run", REPORT)
    change(answer["record"])
    with pytest.raises(
        UnreadableAnswer, match=rf"^gw-1: the agent's answer to `run`: {named}.*; nothing is taken"
    ) as err:
        decoded(RunReport, "run", answer)
    assert "run the command again" in str(err.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            lambda a: a.update(schema_version=ANSWER_SCHEMA_VERSION + 1),
            "schema_version: 2 is not supported (this edgetune reads version 1)",
        ),
        (lambda a: a.pop("schema_version"), "schema_version: None is not supported (this edgetune reads version 1)"),
        (
            lambda a: [a.pop(k) for k in ("schema", "schema_version", "verb")] and a.update(a.pop("record")),
            f"schema: not an {ANSWER_SCHEMA} answer",
        ),
        (lambda a: a.update(verb="status"), "verb: 'status' answered, `run` was asked"),
        (lambda a: a.update(error="and a failure"), "record, error: an answer carries exactly one of them"),
    ],
)
def test_another_version_verb_or_shape_of_answer_is_refused_by_name(change, named):
    answer = printed("run", REPORT)
    change(answer)
    with pytest.raises(UnreadableAnswer) as err:
        decoded(RunReport, "run", answer)
    assert str(err.value).startswith(f"gw-1: the agent's answer to `run`: {named}; nothing is taken from it"), err.value


def test_a_verb_that_failed_on_the_board_says_why():
    with pytest.raises(DeployError, match="^gw-1: the agent's `run` failed: the library cannot be loaded$"):
        decoded(RunReport, "run", answer_json("run", error="the library cannot be loaded"))
