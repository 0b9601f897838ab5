"""The host's state files (fleet.json, sim.json, deployed.json): versioned, decoded by the
schema codec, so a damaged or hand-edited file is refused naming the file and the field, and
a file written before the version keys existed still reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgetune.errors import FleetError
from edgetune.fleet.state import (
    BoardRecord,
    FleetState,
    TrackerRecord,
    load_deployed,
    load_fleet_state,
    load_sim_pids,
    record_deployed,
    save_fleet_state,
    save_sim_pids,
    state_path,
)
from edgetune.inventory import load_fleet

TRACKER = {"name": "host", "host": "10.0.0.1", "port": 9190, "pid": 42}


@pytest.fixture
def fleet(spare_fleet_yaml):
    return load_fleet(spare_fleet_yaml)


def test_every_state_file_carries_its_schema_and_version(fleet):
    save_fleet_state(
        fleet,
        FleetState(
            {"host": TrackerRecord(**TRACKER)}, {"b": BoardRecord(7, "10.0.0.1:9190", "c", "3.11", "0.27", "fw")}
        ),
    )
    save_sim_pids(fleet, {"b": 1234})
    record_deployed(fleet, "b", "mlp", 3)
    record_deployed(fleet, "b", "mlp2", "unknown")
    for name, schema in (
        ("fleet", "edgetune.fleet-state"),
        ("sim", "edgetune.sim-state"),
        ("deployed", "edgetune.deployed"),
    ):
        raw = json.loads(state_path(fleet, name).read_bytes())
        assert (raw["schema"], raw["schema_version"]) == (schema, 1)
    assert load_sim_pids(fleet) == {"b": 1234}
    assert load_deployed(fleet) == {"b": {"mlp": 3, "mlp2": "unknown"}}


def test_files_written_before_the_version_keys_still_read(fleet):
    path = state_path(fleet, "fleet")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"trackers": {"host": TRACKER}, "boards": {}}, indent=2))
    assert load_fleet_state(fleet).trackers["host"] == TrackerRecord(**TRACKER)
    state_path(fleet, "sim").write_text(json.dumps({"sshd_pids": {"b": 99}}))
    assert load_sim_pids(fleet) == {"b": 99}


@pytest.mark.parametrize(
    "content, message",
    [
        ({"trackers": {"host": {**TRACKER, "address": "x"}}}, "fleet.json: trackers.host.address: unknown key"),
        (
            {"trackers": {"host": {k: v for k, v in TRACKER.items() if k != "pid"}}},
            "fleet.json: trackers.host.pid: required field is missing",
        ),
        (
            {"trackers": {"host": {**TRACKER, "port": "9190"}}},
            "fleet.json: trackers.host.port: must be an integer, got str '9190'",
        ),
        (
            {"schema": "edgetune.fleet-state", "schema_version": 2},
            "fleet.json: schema_version: 2 is not supported (this edgetune reads version 1)",
        ),
        ({"schema": "edgetune.sim-state", "schema_version": 1}, "fleet.json: schema: not an edgetune.fleet-state file"),
        ([], "fleet.json: schema: not an edgetune.fleet-state file"),
    ],
    ids=["renamed-field", "missing-field", "wrong-type", "newer-version", "other-schema", "not-a-mapping"],
)
def test_a_damaged_state_file_is_refused_naming_the_field(fleet, content, message):
    path = state_path(fleet, "fleet")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(content))
    with pytest.raises(FleetError, match="repair it, or remove it") as err:
        load_fleet_state(fleet)
    assert message in str(err.value)


def test_duplicate_keys_are_refused(fleet):
    path = state_path(fleet, "deployed")
    path.parent.mkdir(parents=True)
    path.write_text('{"boards": {"b": {"mlp": 1, "mlp": 2}}}')
    with pytest.raises(FleetError, match=r"deployed.json: duplicate key\(s\) 'mlp'"):
        load_deployed(fleet)


@given(
    value=st.one_of(
        st.dictionaries(st.text(max_size=5), st.booleans(), max_size=2),
        st.text().filter(lambda t: t != "unknown"),
        st.integers(max_value=0),
        st.booleans(),
        st.floats(allow_nan=True),
        st.lists(st.integers(), max_size=2),
    )
)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_value_no_version_is_refused_and_the_record_stays_as_it_was(fleet, value):
    """What a board says it runs reaches deployed.json only as a version, None or "unknown"."""
    record_deployed(fleet, "b", "mlp", 3)
    before = state_path(fleet, "deployed").read_bytes()
    with pytest.raises(FleetError, match=r"b: .* is not a version of mlp"):
        record_deployed(fleet, "b", "mlp", value)
    assert state_path(fleet, "deployed").read_bytes() == before
    assert load_deployed(fleet) == {"b": {"mlp": 3}}
