"""The `measurement` section of device profiles: tuning settings, the interleaved comparison
settings (`compare`) and the refused cache flush."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgetune.errors import InventoryError
from edgetune.inventory import load_profile
from edgetune.inventory.schema import CompareSettings

REPO = Path(__file__).resolve().parents[2]


def _profile_with(tmp_path: Path, measurement: dict) -> Path:
    data = yaml.safe_load((REPO / "device_profiles/x86-avx512.yaml").read_text())
    data["measurement"] = measurement
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("path", sorted((REPO / "device_profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_profiles_compare_in_rounds_spanning_cfs_periods(path):
    compare = load_profile(path).measurement.compare
    assert compare.rounds >= 2 and compare.repeat >= 1
    assert compare.min_repeat_ms >= 300  # at least three 100 ms CFS periods per sample


def test_compare_settings_are_read_and_default_when_absent(tmp_path):
    settings = {"number": 2, "compare": {"rounds": 6, "repeat": 4, "min_repeat_ms": 500}}
    profile = load_profile(_profile_with(tmp_path, settings))
    assert profile.measurement.number == 2
    assert profile.measurement.compare == CompareSettings(rounds=6, repeat=4, min_repeat_ms=500)
    assert load_profile(_profile_with(tmp_path, {})).measurement.compare == CompareSettings()


def test_cache_flush_false_is_still_accepted(tmp_path):
    assert load_profile(_profile_with(tmp_path, {"enable_cpu_cache_flush": False})).measurement.number > 0


@pytest.mark.parametrize(
    "measurement, message",
    [
        ({"enable_cpu_cache_flush": True}, "measurement.enable_cpu_cache_flush: is no longer supported"),
        ({"compare": {"rounds": 0}}, "measurement.compare.rounds: must be positive, got 0"),
        ({"compare": {"min_repeat_ms": "300"}}, "measurement.compare.min_repeat_ms: must be an integer"),
        ({"compare": {"round": 4}}, "measurement.compare.round: unknown key (did you mean 'rounds'?)"),
        ({"compare": 4}, "measurement.compare: must be a mapping"),
    ],
)
def test_bad_measurement_settings_are_refused(tmp_path, measurement, message):
    with pytest.raises(InventoryError) as err:
        load_profile(_profile_with(tmp_path, measurement))
    assert message in str(err.value)
