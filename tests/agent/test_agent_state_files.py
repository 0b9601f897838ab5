"""The board's state.json and decisions.json are decoded by the schema codec: a damaged or
edited file is refused naming the file and the field, and says what to do."""

from __future__ import annotations

import json

import pytest

from edgetune.agent.errors import AgentError
from edgetune.agent.file_tree import FileTree
from edgetune.agent.state import (
    ModelState,
    last_decision_serial,
    load_state,
    record_decision_serial,
    save_state,
)

ENTRY = {"version": 2, "since": "2026-01-01T00:00:00Z", "firmware": "fw", "previous": 1, "highest_installed": 2}


def test_state_and_serial_round_trip(tmp_path):
    tree = FileTree(tmp_path)
    assert load_state(tree) == {} and last_decision_serial(tree) == 0
    save_state(tree, {"mlp": ModelState(**ENTRY)})
    record_decision_serial(tree, 7)
    assert load_state(tree) == {"mlp": ModelState(**ENTRY)} and last_decision_serial(tree) == 7


@pytest.mark.parametrize(
    "models, message",
    [
        ({"mlp": {**ENTRY, "current": 2}}, "state.json: models.mlp.current: unknown key"),
        (
            {"mlp": {k: v for k, v in ENTRY.items() if k != "highest_installed"}},
            "models.mlp.highest_installed: required field is missing",
        ),
        ({"mlp": {**ENTRY, "version": "2"}}, "models.mlp.version: must be an integer, got str '2'"),
        ([], "state.json: models: must be a mapping, got a list"),
    ],
)
def test_a_damaged_state_is_refused_naming_the_field(tmp_path, models, message):
    (tmp_path / "state.json").write_text(
        json.dumps({"schema": "edgetune.agent-state", "schema_version": 1, "models": models})
    )
    with pytest.raises(AgentError, match="restore it, or remove it to start over") as err:
        load_state(FileTree(tmp_path))
    assert message in str(err.value)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"schema":"edgetune.agent-decisions","schema_version":1,"last_serial":-1}',
            "last_serial: must be zero or more, got -1",
        ),
        (
            '{"schema":"edgetune.agent-decisions","schema_version":1,"last_serial":1,"last_serial":9}',
            "duplicate key(s) 'last_serial'",
        ),
        (
            '{"schema":"edgetune.agent-decisions","schema_version":1,"last_serial":true}',
            "last_serial: must be an integer, got boolean True",
        ),
    ],
)
def test_a_damaged_decisions_file_is_refused(tmp_path, text, message):
    (tmp_path / "decisions.json").write_text(text)
    with pytest.raises(AgentError, match="`edgetune fleet reset-serial BOARD` writes it anew") as err:
        last_decision_serial(FileTree(tmp_path))
    assert message in str(err.value)
