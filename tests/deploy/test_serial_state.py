"""The decision serial file carries its schema_version; a damaged one stops signing with its name."""

from __future__ import annotations

import json

import pytest

from edgetune.deploy.decisions import SerialCounter
from edgetune.errors import DeployError


def test_the_serial_file_is_versioned_and_an_unversioned_one_still_reads(tmp_path):
    path = tmp_path / "decision-serial.json"
    serial = SerialCounter(path).next()
    assert json.loads(path.read_text()) == {"schema": "edgetune.decision-serial", "schema_version": 1, "serial": serial}
    path.write_text(json.dumps({"serial": serial + 5}))
    assert SerialCounter(path).next() > serial + 5


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"serial": true}', "serial: must be an integer, got boolean True"),
        ('{"serial": -1}', "serial: must be zero or more, got -1"),
        ('{"schema": "edgetune.decision-serial", "schema_version": 2, "serial": 3}', "schema_version: 2 is not supported"),
        ('{"serial": 3, "extra": 1}', "extra: unknown key"),
        ("[1]", "schema: not an edgetune.decision-serial file"),
        ("{", "not valid JSON"),
    ],
)
def test_a_damaged_serial_file_refuses_to_sign_and_names_what_is_wrong(tmp_path, content, expected):
    path = tmp_path / "decision-serial.json"
    path.write_text(content)
    with pytest.raises(DeployError) as err:
        SerialCounter(path).next()
    assert str(err.value).startswith(f"{path}: {expected}") and "remove it only if the host's clock is right" in str(err.value)
    assert path.read_text() == content
