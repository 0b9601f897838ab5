"""fleet.yaml's per-model hooks (`on_switch`, `health`): decoded, round-tripped, carried into the
agent.json a rollout writes (none: not written), and every bad value refused with the file, the
YAML path and what is allowed."""

from __future__ import annotations

import pytest
from support.inventory_dump import fleet_to_dict
from support.inventory_files import base_fleet, write

from edgetune.agent.config import HealthCheck as AgentHealthCheck
from edgetune.agent.config import ModelHooks
from edgetune.deploy.remote import model_hooks
from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import HealthCheck


@pytest.fixture
def fleet_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_hooks_load_round_trip_and_reach_agent_json(fleet_dir):
    data = base_fleet(fleet_dir)
    data["models"][0].update(on_switch="systemctl reload my-app", health={"command": "/opt/app/check --quick"})
    data["models"][1].update(health={"command": "curl -fsS localhost:8080/ready", "timeout_s": 5})
    fleet = load_fleet(write(fleet_dir, data))
    mlp, relu = fleet.models
    assert (mlp.on_switch, mlp.health) == ("systemctl reload my-app", HealthCheck("/opt/app/check --quick", 30.0))
    assert (relu.on_switch, relu.health) == (None, HealthCheck("curl -fsS localhost:8080/ready", 5.0))
    assert load_fleet(write(fleet_dir, fleet_to_dict(fleet), "dumped.yaml")).models == fleet.models
    assert model_hooks(fleet) == {
        "mlp": ModelHooks("systemctl reload my-app", AgentHealthCheck("/opt/app/check --quick", 30.0)),
        "relu": ModelHooks(None, AgentHealthCheck("curl -fsS localhost:8080/ready", 5.0)),
    }
    plain = load_fleet(write(fleet_dir, base_fleet(fleet_dir), "plain.yaml"))
    assert [(m.on_switch, m.health) for m in plain.models] == [(None, None)] * 2 and model_hooks(plain) is None


BAD_HOOKS = [
    ({"on_switch": ""}, "fleet.yaml: models[0].on_switch: must not be empty"),
    ({"on_switch": ["systemctl", "reload"]}, "fleet.yaml: models[0].on_switch: must be a string, got a list"),
    (
        {"on_switch": "reload\0app"},
        "fleet.yaml: models[0].on_switch: holds the control character or invalid code point U+0000",
    ),
    (
        {"on_switch": "x" * 5000},
        "fleet.yaml: models[0].on_switch: a string of 5000 characters is too long (at most 4096)",
    ),
    (
        {"health": "/opt/app/check"},
        "fleet.yaml: models[0].health: must be a mapping with keys command, timeout_s, got str",
    ),
    ({"health": {"timeout_s": 5}}, "fleet.yaml: models[0].health.command: required field is missing"),
    ({"health": {"command": "  "}}, "fleet.yaml: models[0].health.command: must not be empty"),
    (
        {"health": {"command": "x", "timeout_s": 0}},
        "fleet.yaml: models[0].health.timeout_s: must be between 1 and 3600, got 0",
    ),
    (
        {"health": {"command": "x", "timeout_s": 7200}},
        "fleet.yaml: models[0].health.timeout_s: must be between 1 and 3600, got 7200",
    ),
    (
        {"health": {"command": "x", "timeout_s": "30s"}},
        "fleet.yaml: models[0].health.timeout_s: must be a number, got str '30s'",
    ),
    (
        {"health": {"command": "x", "timeout": 5}},
        "fleet.yaml: models[0].health.timeout: unknown key (did you mean 'timeout_s'?)",
    ),
]


@pytest.mark.parametrize("entry, expected", BAD_HOOKS, ids=[e for _, e in BAD_HOOKS])
def test_bad_hooks_are_refused_with_their_path(fleet_dir, entry, expected):
    data = base_fleet(fleet_dir)
    data["models"][0].update(entry)
    with pytest.raises(InventoryError) as err:
        load_fleet(write(fleet_dir, data))
    assert expected in str(err.value)
