"""`starts_fleet`, for a fixture that starts boards, sshd, a tracker, an artifact server, a
tuning run or the agent's processes (or that serves only tests which do, like a fleet slot):
tests/conftest.py marks every test that needs such a fixture (directly or through
another) `fleet`, so `pytest -m "not fleet"` runs the unit-level tests alone (make test-unit
leaves out those marked `tvm` too)."""

from __future__ import annotations


def starts_fleet(fixture_function):
    """Put under `@pytest.fixture`: the fixture's tests are marked `fleet`."""
    fixture_function.starts_fleet = True
    return fixture_function
