"""How `make test` hands out its groups (tests/support/worker_groups.py): a group's expected
length is its seconds in tests/durations.json, or its tests' markers' estimate; a run with
`--store-durations` writes each group's seconds there."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from support import worker_groups
from support.worker_groups import DurationRecorder, group_seconds


class FakeItem:
    def __init__(self, nodeid: str, *markers: str, fixtures: tuple[str, ...] = ()):
        self.nodeid, self.markers, self.fixturenames = nodeid, set(markers), list(fixtures)

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


@pytest.fixture
def durations_file(tmp_path, monkeypatch):
    path = tmp_path / "durations.json"
    monkeypatch.setattr(worker_groups, "DURATIONS_FILE", path)
    return path


def test_a_measured_group_weighs_its_seconds_and_an_unmeasured_one_its_markers(durations_file):
    durations_file.write_text(json.dumps({"tests/a.py": 45.0}))
    items = [
        FakeItem("tests/a.py::test_long", "fleet"),
        FakeItem("tests/b.py::test_fleet", "fleet"),
        FakeItem("tests/b.py::test_compiles", "tvm"),
        FakeItem("tests/b.py::test_plain"),
        FakeItem("tests/c.py::test_uses_the_session_fleet", "fleet", fixtures=("sim_fleet",)),
    ]
    groups = {item.nodeid: worker_groups.group_of(item) for item in items}
    assert group_seconds(items, groups) == {
        "tests/a.py": 45.0,
        "tests/b.py": pytest.approx(10.0 + 2.0 + 0.05),
        "session-fleet": 10.0,
    }


def test_without_the_file_every_group_is_weighed_by_its_markers(durations_file):
    items = [FakeItem("tests/a.py::test_one", "fleet"), FakeItem("tests/a.py::test_two", "tvm")]
    assert group_seconds(items, {item.nodeid: "tests/a.py" for item in items}) == {"tests/a.py": 12.0}


def test_a_run_storing_durations_writes_each_groups_seconds_summed_over_its_phases(durations_file):
    items = [FakeItem("tests/a.py::test_one"), FakeItem("tests/b.py::test_two", fixtures=("sim_fleet",))]
    recorder = DurationRecorder(SimpleNamespace())
    for nodeid, seconds in [
        ("tests/a.py::test_one", 1.0),
        ("tests/a.py::test_one", 2.5),
        ("tests/b.py::test_two", 4.0),
        ("tests/d.py::test_collected_by_no_item", 0.25),
    ]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    recorder.pytest_sessionfinish(SimpleNamespace(items=items), pytest.ExitCode.OK)
    assert json.loads(durations_file.read_text()) == {
        "session-fleet": 4.0,
        "tests/a.py": 3.5,
        "tests/d.py": 0.2,
    }


def test_an_interrupted_run_leaves_the_file_as_it_was(durations_file):
    durations_file.write_text('{"tests/a.py": 9.0}\n')
    recorder = DurationRecorder(SimpleNamespace())
    recorder.pytest_runtest_logreport(SimpleNamespace(nodeid="tests/a.py::test_one", duration=1.0))
    recorder.pytest_sessionfinish(SimpleNamespace(items=[]), pytest.ExitCode.INTERRUPTED)
    assert durations_file.read_text() == '{"tests/a.py": 9.0}\n'
