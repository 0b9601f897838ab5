"""A device class's tuning pool (`device_classes[].tuning_pool`): the boards named or selected
become the class's pool, in inventory order, and round-trip; no setting keeps every board in it;
a pool entry that names no board of the class, or an empty pool, is refused with the file, the
YAML path and what is allowed; `plan` says which board is which."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.inventory_dump import fleet_to_dict
from support.inventory_files import write
from support.tests_samples import FAKE_PRIVATE_KEY

from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet
from edgetune.inventory.fleet_plan import plan_fleet
from edgetune.inventory.schema import POOL, TARGET

REPO = Path(__file__).resolve().parents[2]


def _board(name: str, device_class: str, **labels: str) -> dict:
    return {
        "name": name,
        "address": f"{name}.local",
        "device_class": device_class,
        "python": "/usr/bin/python3",
        "workdir": "/var/lib/edgetune",
        "labels": labels,
    }


def _fleet_data(tmp: Path, pool=None) -> dict:
    key = tmp / "id_ed25519"
    key.write_text(FAKE_PRIVATE_KEY)
    key.chmod(0o600)
    gw = {"name": "gw", "profile": str(REPO / "device_profiles/rpi4.yaml")}
    if pool is not None:
        gw["tuning_pool"] = pool
    return {
        "version": 1,
        "name": "pooled",
        "workdir": "work",
        "trackers": [{"name": "host", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 9190}],
        "ssh": {"user": "root", "key": str(key), "known_hosts": "known_hosts"},
        "device_classes": [gw, {"name": "cam", "profile": str(REPO / "device_profiles/rpi5.yaml")}],
        "boards": [
            _board("field-1", "gw", role="field"),
            _board("lab-1", "gw", role="lab", site="berlin"),
            _board("lab-2", "gw", role="lab"),
            _board("cam-1", "cam", role="lab"),
        ],
        "models": [{"name": "mlp", "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256]}]}],
        "tuning": {"trials_per_class": 64},
        "artifacts": {"dir": "artifacts", "signing_key": "keys/signing.key", "public_key": "keys/signing.pub"},
    }


def _load(tmp: Path, pool):
    return load_fleet(write(tmp, _fleet_data(tmp, pool)))


@pytest.mark.parametrize(
    "pool", [["lab-2", "lab-1"], ["role=lab"], ["lab-2", "site=berlin"], ["lab-1", "lab-1", "board=lab-2"]]
)
def test_names_and_selectors_make_the_pool_in_inventory_order(fleet_dir, pool):
    fleet = _load(fleet_dir, pool)
    assert fleet.device_class("gw").tuning_pool == ("lab-1", "lab-2")
    assert [b.name for b in fleet.pool_of("gw")] == ["lab-1", "lab-2"]
    assert [fleet.role(b) for b in fleet.boards] == [TARGET, POOL, POOL, POOL]
    again = load_fleet(write(fleet_dir, fleet_to_dict(fleet), "again.yaml"))
    assert again.replace(path=fleet.path) == fleet


def test_without_a_pool_every_board_of_the_class_tunes(fleet_dir):
    fleet = _load(fleet_dir, None)
    assert fleet.device_class("gw").tuning_pool is None
    assert fleet.pool_of("gw") == fleet.boards_of("gw")
    assert {fleet.role(b) for b in fleet.boards} == {POOL}


def test_plan_names_the_pool_and_marks_the_targets(fleet_dir):
    gw = next(c for c in plan_fleet(_load(fleet_dir, ["role=lab"])).classes if c.device_class == "gw")
    assert gw.boards == ("field-1", "lab-1", "lab-2") and gw.tuning_pool == ("lab-1", "lab-2")
    assert gw.boards_text() == "field-1 (target), lab-1, lab-2"
    assert gw.tracker == "host"


@pytest.mark.parametrize(
    "pool, expected",
    [
        (
            [],
            "device_classes[0].tuning_pool: is empty: a class whose pool has no board can be neither tuned nor "
            "measured; name at least one of its boards, or leave tuning_pool out (every board of the class tunes)",
        ),
        (
            ["lab_1"],
            "device_classes[0].tuning_pool[0]: 'lab_1' is not a board of the fleet (did you mean 'lab-1'?); "
            "allowed: the class's boards (field-1, lab-1, lab-2), or selectors key=value[,key=value...] over "
            "their labels",
        ),
        (
            ["lab-1", "cam-1"],
            "device_classes[0].tuning_pool[1]: 'cam-1' is a board of class 'cam', not of 'gw'; "
            "allowed: the class's boards (field-1, lab-1, lab-2)",
        ),
        (
            ["role=bench"],
            "device_classes[0].tuning_pool[0]: selector 'role=bench' matches no board of class 'gw' "
            "(its boards have role: field, lab); allowed: the class's boards",
        ),
        (["rack=12"], "selector 'rack=12' matches no board of class 'gw' (its boards have rack: none)"),
        (["role="], "device_classes[0].tuning_pool[0]: selector 'role=': 'role=' is not key=value"),
        (["role=lab,role=field"], "'role' is given twice"),
        (
            "lab-1",
            "device_classes[0].tuning_pool: must be a list of the class's board names or selectors "
            "key=value[,key=value...], e.g. [lab-1, lab-2] or [role=lab], got str 'lab-1'",
        ),
        ([7], "device_classes[0].tuning_pool[0]: must be a string, got int 7"),
        ([""], "device_classes[0].tuning_pool[0]: must not be empty"),
    ],
)
def test_a_bad_pool_is_refused_with_the_file_the_field_and_what_is_allowed(fleet_dir, pool, expected):
    with pytest.raises(InventoryError) as err:
        _load(fleet_dir, pool)
    assert str(err.value).startswith("fleet.yaml: ")
    assert expected in str(err.value)
