"""The agent's `run` answer as the host reads it: decoded into the agent's own record, so a
renamed or retyped field is an error that names it, never a silent `None` or a wrong verdict."""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from edgetune.agent.run_report import RunReport
from edgetune.deploy.remote import RemoteAgent
from edgetune.errors import DeployError

REPORT = RunReport("gw-1", "mlp", 3, "reference", {"output0": (1, 10)}, True, 1e-6, "", "2", 1, 6, 0, (0.001, 0.0011), 1.05)


def answer() -> dict:
    """REPORT as the agent prints it (JSON)."""
    return json.loads(json.dumps(asdict(REPORT)))


def decoded(record: dict) -> RunReport:
    agent = SimpleNamespace(board=SimpleNamespace(name="gw-1"))  # _decoded reads only the board's name
    return RemoteAgent._decoded(agent, RunReport, "run", record)


def test_a_run_answer_is_decoded_into_the_record():
    assert decoded(answer()) == REPORT


@pytest.mark.parametrize(
    ("change", "named"),
    [(lambda r: r.update(samples=r.pop("samples_s")), "samples"), (lambda r: r.update(outputs_match="yes"), "outputs_match"),
     (lambda r: r.pop("median_ms"), "median_ms")],
)  # fmt: skip
def test_a_renamed_or_retyped_field_is_refused_by_name(change, named):
    record = answer()
    change(record)
    with pytest.raises(DeployError, match=rf"gw-1: the agent's answer to `run` is not what an agent answers .*{named}"):
        decoded(record)


def test_an_agent_that_failed_says_why():
    with pytest.raises(DeployError, match="gw-1: the agent's `run` failed: the library cannot be loaded"):
        decoded({"error": "the library cannot be loaded"})
