"""Measurement on a device class's boards: MetaSchedule's RPCRunner through the fleet tracker.

Boards of a class register with the tracker under the class name as key, so the tracker hands
each measurement to a free board of that class; as many measurements run at once as the class
has boards. A board that dies mid-measurement turns that candidate into a failed RunnerResult
(TVM's RPCRunner catches the broken session) and the tracker stops handing it out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tvm import rpc
from tvm.s_tir import meta_schedule as ms

from edgetune.fleet.status import rpc_endpoint
from edgetune.inventory.schema import Fleet

SESSION_TIMEOUT_S = 60


@dataclass(frozen=True)
class ClassEndpoint:
    """Where a device class's boards are: its tracker address and key, and how many boards."""

    device_class: str
    tracker_host: str
    tracker_port: int
    boards: int

    @classmethod
    def of(cls, fleet: Fleet, device_class: str) -> "ClassEndpoint":
        endpoint = rpc_endpoint(fleet, device_class)
        return cls(device_class, endpoint.host, endpoint.port, len(fleet.boards_of(device_class)))

    def wait_for_boards(self, timeout_s: float = SESSION_TIMEOUT_S + 15) -> int:
        """Registered boards, waiting up to `timeout_s` for the first: after a host crash a
        board re-registers only when its orphaned session times out."""
        deadline = time.monotonic() + timeout_s
        while (registered := self.boards_online()[0]) == 0 and time.monotonic() < deadline:
            time.sleep(1.0)
        return registered

    def boards_online(self) -> tuple[int, int]:
        """(registered, busy) boards of the class, as the tracker sees them now."""
        summary = rpc.connect_tracker(self.tracker_host, self.tracker_port).summary()
        queue = summary["queue_info"].get(self.device_class, {"free": 0, "pending": 0})
        registered = sum(
            1 for server in summary["server_info"] if server["key"].split(":")[-1] == self.device_class
        )
        return registered, max(registered - int(queue["free"]), 0)


def make_runner(endpoint: ClassEndpoint, measurement) -> ms.runner.RPCRunner:
    """An RPCRunner on the class's boards with the profile's measurement settings."""
    return ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(
            tracker_host=endpoint.tracker_host,
            tracker_port=endpoint.tracker_port,
            tracker_key=endpoint.device_class,
            session_timeout_sec=SESSION_TIMEOUT_S,
        ),
        evaluator_config=ms.runner.EvaluatorConfig(
            number=measurement.number,
            repeat=measurement.repeat,
            min_repeat_ms=measurement.min_repeat_ms,
        ),
        cooldown_sec=measurement.cooldown_ms / 1000.0,
        max_workers=endpoint.boards,
    )
