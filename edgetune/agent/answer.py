"""The agent's answers: with `--json`, every verb prints one line, a versioned record.

`{"schema": "edgetune.agent-answer", "schema_version": 1, "verb": VERB, "record": {...}}` carries
the verb's record (`install`: a ChangeRecord, `status`: an InstallationStatus, ...), and
`{"schema": ..., "schema_version": 1, "verb": VERB, "error": "..."}` says why the verb failed
before it had one. Whoever runs a verb (the host's `deploy.remote.RemoteAgent`, an install
reading its `check` child) takes the last line of its stdout that is a JSON object and decodes
it with `read_answer`, then the record with `answer_record`: a missing, renamed or mistyped
field, another schema version or another verb is an error naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from edgetune.artifact_format.codec import SchemaError, decode, load_versioned, to_json

ANSWER_SCHEMA = "edgetune.agent-answer"
ANSWER_SCHEMA_VERSION = 1
T = TypeVar("T")


@dataclass(frozen=True)
class AgentAnswer:
    """One answer: the verb's `record`, or the `error` that stopped the verb (exactly one of them)."""

    verb: str
    record: Mapping[str, Any] | None = None
    error: str | None = None


def answer_json(verb: str, record: Any = None, error: str | None = None) -> dict:
    """The answer to `verb` as printed: its record (a record type or plain data), or its error."""
    body = {"error": error} if error is not None else {"record": to_json(record)}
    return {"schema": ANSWER_SCHEMA, "schema_version": ANSWER_SCHEMA_VERSION, "verb": verb, **body}


def last_json_object(output: str) -> str | None:
    """The last line of `output` that is a JSON object (what a library printed before it is not)."""
    for line in reversed(output.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return line
    return None


def read_answer(line: str, verb: str, where: str, error: type[Exception]) -> AgentAnswer:
    """`line` as the answer to `verb`; any misfit is an `error` naming `where` and the field."""
    answer = load_versioned(
        AgentAnswer,
        line.encode("utf-8"),
        where,
        ANSWER_SCHEMA,
        ANSWER_SCHEMA_VERSION,
        what="answer",
        error=error,
        reader="this edgetune",
    )
    if answer.verb != verb:
        raise error(f"{where}: verb: {answer.verb[:40]!r} answered, `{verb}` was asked")
    if (answer.record is None) == (answer.error is None):
        raise error(f"{where}: record, error: an answer carries exactly one of them")
    return answer


def answer_record(cls: type[T], answer: AgentAnswer, where: str, error: type[Exception]) -> T:
    """The record of a successful `answer` as `cls`; a misfit is an `error` naming `where` and the field."""
    try:
        return decode(cls, dict(answer.record or {}), "record")
    except SchemaError as err:
        raise error(f"{where}: {err}") from None
