"""measure: every board of a class is reached through a real TVM tracker (on loopback), and the
libraries being compared are timed in interleaved rounds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tvm
from support.fleet_marker import starts_fleet
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from edgetune.artifact.measure import interleave, run_on_boards
from edgetune.compiler.models import entry_function
from edgetune.fleet.tracker import TRACKER_MODULE, RpcEndpoint
from edgetune.inventory.schema import Board, CompareSettings, Measurement, SshSettings

KEY = "loopback-class"
ADDRESSES = ("127.0.0.2", "127.0.0.3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *argv], stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _port_answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _wait(condition, message: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def _registered(port: int) -> int:
    from tvm import rpc

    try:
        summary = rpc.connect_tracker("127.0.0.1", port).summary()
    except (RuntimeError, OSError):
        return 0
    return sum(1 for s in summary["server_info"] if s["key"] == f"server:{KEY}")


@pytest.fixture(scope="module")
@starts_fleet
def loopback_class(tmp_path_factory):
    """A tracker and two rpc_servers (127.0.0.2, 127.0.0.3) registered under one key."""
    logs = tmp_path_factory.mktemp("rpc")
    port = _free_port()
    procs = [
        _spawn(
            [TRACKER_MODULE, "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)],
            logs / "tracker.log",
        )
    ]
    _wait(lambda: _port_answers(port), "the tracker did not start")
    for addr in ADDRESSES:
        procs.append(
            _spawn(
                [
                    "tvm.exec.rpc_server",
                    "--tracker",
                    f"127.0.0.1:{port}",
                    "--key",
                    KEY,
                    "--host",
                    addr,
                    "--custom-addr",
                    addr,
                    "--port",
                    "9090",
                    "--port-end",
                    "9190",
                ],
                logs / f"server-{addr}.log",
            )
        )
    try:
        _wait(lambda: _registered(port) == len(ADDRESSES), "the rpc servers did not register")
        boards = [
            Board(
                name=f"b{i}",
                address=a,
                device_class=KEY,
                tracker="t",
                python=sys.executable,
                workdir=str(logs),
                ssh=SshSettings(transport="direct"),
            )
            for i, a in enumerate(ADDRESSES)
        ]
        yield RpcEndpoint("127.0.0.1", port, KEY), boards
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


@I.ir_module
class TwoOutputs:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.add(x, x)
            z = R.multiply(x, x)
            out = (y, z)
            R.output(out)
        return out


@I.ir_module
class Heavier:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.matmul(R.broadcast_to(R.reshape(x, (32, 1)), (32, 512)), R.ones((512, 512), "float32"))
            R.output(y)
        return y


def _library(module, path: Path) -> Path:
    relax.build(module, target=tvm.target.Target({"kind": "llvm"}), exec_mode="compiled").export_library(str(path))
    return path


QUICK = Measurement(compare=CompareSettings(rounds=3, repeat=2, min_repeat_ms=5))


def test_every_board_runs_and_times_the_libraries_in_rounds(loopback_class, tmp_path):
    endpoint, boards = loopback_class
    light, heavy = _library(TwoOutputs, tmp_path / "light.so"), _library(Heavier, tmp_path / "heavy.so")
    x = np.arange(32, dtype="float32").reshape(4, 8)
    extra = Board(
        name="offline", address="127.0.0.9", device_class=KEY, tracker="t", python="", workdir="", ssh=SshSettings()
    )
    libraries = {"light": light, "heavy": heavy, "light-again": light}
    result = run_on_boards(endpoint, [*boards, extra], libraries, entry_function(TwoOutputs), [x], QUICK)
    assert sorted(result.succeeded) == ["b0", "b1"]
    assert "offline: not registered with the tracker" in result.failed["offline"]
    for runs in result.succeeded.values():
        assert list(runs) == ["light", "heavy", "light-again"]
        np.testing.assert_array_equal(runs["light"].outputs["output0"], x + x)
        np.testing.assert_array_equal(runs["light-again"].outputs["output1"], x * x)
        assert runs["heavy"].outputs["output0"].shape == (32, 512)
        for run in runs.values():
            timing = run.timing
            assert timing.samples == len(timing.samples_ms) == 3 * 2
            assert timing.min_ms <= timing.median_ms <= timing.max_ms and timing.iqr_ms >= 0
        assert runs["heavy"].timing.median_ms > runs["light"].timing.median_ms


def test_rounds_take_turns_and_keep_every_sample():
    calls = []

    def timer(label):
        def take():
            calls.append(label)
            return [float(len(calls)), float(len(calls)) + 0.5]

        return take

    samples = interleave({"a": timer("a"), "b": timer("b")}, rounds=4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert samples == {"a": (1.0, 1.5, 4.0, 4.5, 5.0, 5.5, 8.0, 8.5), "b": (2.0, 2.5, 3.0, 3.5, 6.0, 6.5, 7.0, 7.5)}
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        interleave({"a": timer("a")}, rounds=0)
