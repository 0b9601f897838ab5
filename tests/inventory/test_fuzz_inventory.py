"""Property: whatever value of whatever type sits at whatever place of the shipped fleet.yaml
or of a profile, `edgetune check` either accepts the inventory (exit 0) or refuses it with
exit 2 and a message naming the file and a YAML path; never a traceback, never another code."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgetune.cli import main

REPO = Path(__file__).resolve().parents[2]
FLEET = yaml.safe_load((REPO / "fleet.yaml").read_text())
PROFILE_NAME = "x86-avx512.yaml"
PROFILE = yaml.safe_load((REPO / "device_profiles" / PROFILE_NAME).read_text())

# `<file>: <yaml path>: ...`, the path a key (`ssh`, `num-cores`, `["odd key"]`) then `.key`, `[index]` or `["odd key"]` steps
_NAMED_PLACE = re.compile(
    rf"error: (?:\S*/)?(?:fleet\.yaml|{re.escape(PROFILE_NAME)}): (?:[\w-]+|\[\".*?\"\])(?:\[\d+\]|\[\".*?\"\]|\.[\w-]+)*: "
)

_AWKWARD_STRINGS = [
    "",
    " ",
    "..",
    "/",
    "/dev/null",
    "é",
    "💥",
    "999.1.1.1",
    "10.231.7.11",
    "llvm",
    "icelake-server",
    "gateway-avx512",
    "host",
    "mlp",
    "a" * 300,
    "~",
    "-1",
    "1.0",
    "true",
    "null",
    "x\ty",
]
_AWKWARD_NUMBERS = [
    0,
    -1,
    1,
    2**31,
    2**53 + 1,
    2**64,
    10**30,
    10**400,
    0.5,
    -0.0,
    1e308,
    1e-320,
    float("nan"),
    float("inf"),
    float("-inf"),
]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(_AWKWARD_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(_AWKWARD_STRINGS),
    st.text(max_size=12),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _places(data: Any, path: tuple = ()) -> list[tuple]:
    """Every YAML path under the root: mapping keys and list indices."""
    places = [path] if path else []
    if isinstance(data, dict):
        for key, value in data.items():
            places += _places(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            places += _places(value, (*path, index))
    return places


_FLEET_PLACES = _places(FLEET)
_PROFILE_PLACES = _places(PROFILE)


@st.composite
def _mutation(draw) -> tuple[str, tuple, str, Any]:
    target = draw(st.sampled_from(["fleet", "profile"]))
    place = draw(st.sampled_from(_FLEET_PLACES if target == "fleet" else _PROFILE_PLACES))
    action = draw(st.sampled_from(["set", "set", "set", "delete"]))
    return target, place, action, draw(_values) if action == "set" else None


def _mutate(data: Any, place: tuple, action: str, value: Any) -> None:
    parent = data
    for step in place[:-1]:
        parent = parent[step]
    if action == "delete":
        del parent[place[-1]]
    else:
        parent[place[-1]] = value


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(_mutation(), min_size=1, max_size=2))
def test_check_never_crashes_on_a_mutated_inventory(mutations):
    fleet, profile = yaml.safe_load(yaml.safe_dump(FLEET)), yaml.safe_load(yaml.safe_dump(PROFILE))
    for target, place, action, value in mutations:
        try:
            _mutate(fleet if target == "fleet" else profile, place, action, value)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed or replaced this place
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        shutil.copytree(REPO / "device_profiles", root / "device_profiles")
        (root / "device_profiles" / PROFILE_NAME).write_text(yaml.safe_dump(profile, allow_unicode=True))
        (root / "fleet.yaml").write_text(yaml.safe_dump(fleet, allow_unicode=True))
        out, errors = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errors):
            code = main(["check", "-f", str(root / "fleet.yaml")])
        err = errors.getvalue()
    assert code in (0, 2), err
    if code == 2:
        assert _NAMED_PLACE.match(err), err
        assert "Traceback" not in err
