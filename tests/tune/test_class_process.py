"""The tuner's class processes (edgetune.tune.class_process): forked from a server that has the
tuner imported, yet with the host's environment, standard error and stop event of the moment
the class starts, as a spawned process would have them."""

from __future__ import annotations

import os
import sys

import pytest

from edgetune.tune import stop
from edgetune.tune.class_process import class_process_pool

pytestmark = pytest.mark.tvm  # the server imports the tuner, and with it TVM


def preloaded() -> bool:
    return "edgetune.tune.tuner" in sys.modules


def environment_variable(name: str) -> str | None:
    return os.environ.get(name)


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def stop_requested() -> str | None:
    return stop.stop_requested()


def in_class_process(function, *args):
    with class_process_pool(1) as pool:
        return pool.submit(function, *args).result(timeout=120)


def test_a_class_process_starts_with_the_tuner_imported():
    assert in_class_process(preloaded)


def test_a_class_process_has_the_hosts_environment_of_when_it_starts(monkeypatch):
    in_class_process(preloaded)  # the server runs from here on, with the environment of now
    monkeypatch.setenv("EDGETUNE_TEST_SET_LATER", "after the server started")
    assert in_class_process(environment_variable, "EDGETUNE_TEST_SET_LATER") == "after the server started"
    monkeypatch.delenv("EDGETUNE_TEST_SET_LATER")
    assert in_class_process(environment_variable, "EDGETUNE_TEST_SET_LATER") is None


def test_a_class_process_writes_to_the_hosts_stderr_of_when_it_starts(tmp_path):
    in_class_process(preloaded)
    log = tmp_path / "stderr.log"
    saved = os.dup(2)
    try:
        with log.open("w") as file:
            os.dup2(file.fileno(), 2)
        in_class_process(to_stderr, "progress of gw-fast")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert log.read_text() == "progress of gw-fast\n"


def test_a_class_process_follows_the_hosts_stop_request(monkeypatch):
    monkeypatch.setattr(stop, "_event", None)  # this test's own event, set below
    assert in_class_process(stop_requested) is None
    stop.request_stop()
    assert in_class_process(stop_requested) == stop.STOPPED
