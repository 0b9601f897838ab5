"""`compute:` in fleet.yaml: `local` by default, or `ray: {address: ..., ...}`; every bad value
refused with the file, the YAML path and what is allowed (exit 2), as every other key is; and
`tune-fleet --ray ADDRESS`, which overrides it, checked the same way."""

from __future__ import annotations

import pytest
from support.inventory_files import base_fleet, write

from edgetune.cli import main
from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet
from edgetune.inventory.loader import with_ray_compute
from edgetune.inventory.schema import RayCompute


def fleet_with(tmp_path, compute):
    data = base_fleet(tmp_path)
    if compute is not None:
        data["compute"] = compute
    return write(tmp_path, data)


def test_without_compute_or_with_local_everything_runs_on_this_host(tmp_path):
    assert load_fleet(fleet_with(tmp_path, None)).compute is None
    assert load_fleet(fleet_with(tmp_path, "local")).compute is None


def test_a_ray_cluster_takes_its_address_and_defaults(tmp_path):
    fleet = load_fleet(fleet_with(tmp_path, {"ray": {"address": "10.0.0.5:6379"}}))
    assert fleet.compute == RayCompute(
        address="10.0.0.5:6379",
        cpus_per_class=1.0,
        build_workers=4,
        cpus_per_build=1.0,
        connect_timeout_s=60.0,
        shards_per_class=1,
    )
    given = {
        "address": "ray://head.example:10001",
        "cpus_per_class": 2,
        "build_workers": 8,
        "cpus_per_build": 0.5,
        "connect_timeout_s": 5,
        "shards_per_class": 3,
    }
    assert load_fleet(fleet_with(tmp_path, {"ray": given})).compute == RayCompute(**given)


@pytest.mark.parametrize(
    ("compute", "expected"),
    [
        ("ray", "compute: 'ray' is not allowed (allowed: local, or a mapping ray: {address: HOST:PORT, ...}"),
        (7, "compute: must be a mapping with keys ray, got int 7"),
        ({"local": True}, "compute.local: unknown key; allowed here: ray"),
        (
            {"ray": None},
            "compute.ray: must be a mapping with keys address, cpus_per_class, build_workers, cpus_per_build, connect_timeout_s, shards_per_class, got nothing",
        ),
        ({"ray": "10.0.0.5:6379"}, "compute.ray: must be a mapping with keys address, cpus_per_class"),
        ({"ray": {"cpus_per_class": 1}}, "compute.ray.address: required field is missing"),
        ({"ray": {"address": "10.0.0.5"}}, "compute.ray.address: '10.0.0.5' is not a Ray cluster address: HOST:PORT"),
        (
            {"ray": {"address": "10.0.0.5:70000"}},
            "compute.ray.address: must be a TCP port between 1 and 65535, got 70000",
        ),
        ({"ray": {"address": "999.1.1.1:6379"}}, "compute.ray.address: '999.1.1.1' is not an IPv4 address"),
        ({"ray": {"address": "h:1", "cpus_per_class": 0}}, "compute.ray.cpus_per_class: must be positive, got 0"),
        (
            {"ray": {"address": "h:1", "cpus_per_build": "one"}},
            "compute.ray.cpus_per_build: must be a number, got str 'one'",
        ),
        (
            {"ray": {"address": "h:1", "build_workers": 1.5}},
            "compute.ray.build_workers: must be an integer, got float 1.5",
        ),
        (
            {"ray": {"address": "h:1", "build_workers": 5000}},
            "compute.ray.build_workers: must be at most 1024, got 5000",
        ),
        ({"ray": {"address": "h:1", "shards": 2}}, "compute.ray.shards: unknown key"),
        ({"ray": {"address": "h:1", "shards_per_class": 0}}, "compute.ray.shards_per_class: must be positive, got 0"),
        (
            {"ray": {"address": "h:1", "shards_per_class": "2"}},
            "compute.ray.shards_per_class: must be an integer, got str '2'",
        ),
    ],
)
def test_bad_compute_settings_exit_2_naming_file_and_field(tmp_path, capsys, compute, expected):
    path = fleet_with(tmp_path, compute)
    with pytest.raises(InventoryError) as refused:
        load_fleet(path)
    assert str(refused.value).startswith(f"{path}: {expected}"), refused.value
    assert main(["check", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err


def test_the_command_line_address_overrides_only_the_address(tmp_path):
    fleet = load_fleet(fleet_with(tmp_path, {"ray": {"address": "10.0.0.5:6379", "cpus_per_class": 2}}))
    assert with_ray_compute(fleet, "127.0.0.1:7000").compute == RayCompute(address="127.0.0.1:7000", cpus_per_class=2)
    local = load_fleet(fleet_with(tmp_path, None))
    assert with_ray_compute(local, "127.0.0.1:7000").compute == RayCompute(address="127.0.0.1:7000")


def test_a_bad_command_line_address_exits_2_before_anything_starts(tmp_path, capsys):
    path = fleet_with(tmp_path, None)
    assert main(["tune-fleet", "-f", str(path), "--ray", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "--ray: 'nowhere' is not a Ray cluster address: HOST:PORT of the head" in err, err
    assert not (tmp_path / "work" / "state").exists()
