"""The decision serial file carries its schema_version; a damaged one stops signing with its name."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgetune.artifact_format.decision import MAX_SERIAL_LEAD_MS, serial_lead_problem
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
        (
            '{"schema": "edgetune.decision-serial", "schema_version": 2, "serial": 3}',
            "schema_version: 2 is not supported",
        ),
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
    assert str(err.value).startswith(f"{path}: {expected}") and "`edgetune fleet reset-serial` writes it anew" in str(
        err.value
    )
    assert path.read_text() == content


FAR_AHEAD = 4102444800001  # 2100-01-01 in milliseconds: a serial a clock running ahead once signed


def test_a_serial_far_ahead_of_the_clock_is_never_signed_until_reset(tmp_path):
    path = tmp_path / "decision-serial.json"
    counter = SerialCounter(path)
    path.write_text(json.dumps({"serial": FAR_AHEAD}))
    with pytest.raises(DeployError, match=r"days ahead of its signing time .* run `edgetune fleet reset-serial`"):
        counter.next()
    assert json.loads(path.read_text()) == {"serial": FAR_AHEAD}  # nothing signed, nothing written
    now = time.time()
    assert counter.reset(now) == int(now * 1000)
    assert int(now * 1000) < counter.next() < FAR_AHEAD


@given(lead_days=st.floats(min_value=0, max_value=3650))
def test_boards_take_exactly_the_serials_a_signer_makes(lead_days):
    """A decision's serial may run ahead of its signed time by at most MAX_SERIAL_LEAD_MS."""
    issued = 1_800_000_000.0
    serial = int(issued * 1000 + lead_days * 86_400_000)
    problem = serial_lead_problem(serial, issued)
    assert (problem is None) == (serial - issued * 1000 <= MAX_SERIAL_LEAD_MS)
    if problem:
        assert f"serial {serial} is" in problem and "days ahead of its signing time" in problem
