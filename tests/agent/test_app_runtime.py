"""The runtime library for applications (`edgetune.agent.app`) and the example application
(`examples/app.py`): a model opened from the board's workdir, run by its interface, following
the agent's switches between calls; the example runs on a board image's Python with only the
agent's bundle of edgetune, through two switches, every call checked."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.agent_support import answer_json
from support.board_image import board_image, runtime_only_image

from edgetune.agent.app import Model, ModelError
from edgetune.agent.install import install_tarball
from edgetune.artifact_format.manifest import Manifest
from edgetune.fleet.agent_bundle import BUNDLE_NAME, agent_bundle

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "app.py"


def test_a_model_runs_by_its_interface_and_follows_switches(board_on, fleet):
    root = board_on(1)
    model = Model.open(root, "mlp")
    manifest = Manifest.from_bytes((root / "releases" / "mlp" / "v1" / "manifest.json").read_bytes())
    assert (
        model.version == 1 and model.inputs == manifest.interface.inputs and model.outputs == manifest.interface.outputs
    )
    given = model.reference_input()
    outputs = model.run(**given)
    assert model.check(outputs).ok and list(outputs) == [s.name for s in model.outputs]
    assert [o.shape for o in outputs.values()] == [s.shape for s in model.outputs]
    with pytest.raises(ModelError, match="x: dtype float64, the model takes float32"):
        model.run(x=given["x"].astype(np.float64))
    with pytest.raises(ModelError, match=r"x: shape \(2, 64\), the model takes \(1, 64\)"):
        model.run(x=np.zeros((2, 64), np.float32))
    with pytest.raises(ModelError, match="the model takes x; missing: x; unknown: y"):
        model.run(y=given["x"])
    assert model.reload_if_changed() is False

    assert install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 2)).result == "installed"
    assert model.reload_if_changed() is True and model.version == 2 and model.check(model.run(**given)).ok

    assert install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", 3)).result == "installed"
    library = root / "releases" / "mlp" / "v3" / "model.so"
    data = bytearray(library.read_bytes())
    data[-1] ^= 0xFF
    library.write_bytes(bytes(data))  # changed on the board after the install
    with pytest.raises(ModelError, match="(?s)v3 of mlp .* cannot be used: .*model.so: sha256 is"):
        model.reload_if_changed()
    assert model.version == 2 and model.check(model.run(**given)).ok  # the release in use stays


def test_a_board_without_an_active_release_says_so(make_board):
    with pytest.raises(ModelError, match="no release of mlp is active on fast-1"):
        Model.open(make_board(), "mlp")


def test_the_example_application_follows_a_rollout_with_no_failed_call(board_on, fleet):
    root = board_on(1)
    (root / BUNDLE_NAME).write_bytes(agent_bundle().data)  # what `fleet up` and rollouts deliver
    python = board_image() / "bin" / "python"
    app = subprocess.Popen(
        [str(python), "-I", str(EXAMPLE), "--workdir", str(root), "--model", "mlp", "--seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    lines: list[dict] = []
    reader = threading.Thread(target=lambda: lines.extend(json.loads(line) for line in app.stdout), daemon=True)
    reader.start()
    switched_at = {}
    try:
        for version in (2, 3):
            _wait_for(lambda: sum(1 for line in lines if line.get("version") == version - 1) >= 20, app)
            assert install_tarball(root, "mlp", fleet.tarball("mlp", "gw-fast", version)).result == "installed"
            switched_at[version] = os.lstat(root / "releases" / "mlp" / "current").st_mtime
        _wait_for(lambda: sum(1 for line in lines if line.get("version") == 3) >= 20, app)
    finally:
        app.terminate()
        _, stderr = app.communicate(timeout=30)
        reader.join(timeout=10)
    calls = [line for line in lines if "call" in line]
    assert calls and all(call["ok"] for call in calls), (stderr, [c for c in calls if not c["ok"]][:3])
    assert [c["version"] for c in calls] == sorted(c["version"] for c in calls)  # never back, never mixed
    followed = {
        line["switched_to"]: line["time"] - switched_at[line["switched_to"]] for line in lines if "switched_to" in line
    }
    print(f"seconds from each switch to the application's first call on it: {followed}")
    assert set(followed) == {2, 3} and all(delay < 2.0 for delay in followed.values()), followed


def _wait_for(condition, app: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert app.poll() is None, f"the application exited: {app.stderr.read()}"
        assert time.monotonic() < deadline, "the application did not get there in time"
        time.sleep(0.05)


def test_a_board_image_without_the_tvm_compiler_installs_and_runs_releases(board_on, fleet, tmp_path):
    """The TVM wheel's compiler library is most of a board image; a board that only runs releases
    does without it: the agent's install (its reference check) and the application both work."""
    python = runtime_only_image(board_image(), tmp_path / "runtime-only")
    site = next((tmp_path / "runtime-only").glob("lib/python3*/site-packages"))
    assert not list(site.glob("tvm/lib/libtvm_compiler*")) and list(site.glob("tvm/lib/libtvm_runtime.so"))
    root = board_on(1)
    (root / BUNDLE_NAME).write_bytes(agent_bundle().data)
    env = {"PATH": "/usr/bin:/bin"}
    installed = subprocess.run(
        [
            str(python),
            "-I",
            str(root / BUNDLE_NAME),
            "--root",
            str(root),
            "install",
            "--model",
            "mlp",
            "--from",
            str(fleet.tarball("mlp", "gw-fast", 2)),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert answer_json("install", installed.stdout, installed.stderr)["result"] == "installed", installed.stderr
    once = subprocess.run(
        [str(python), "-I", str(EXAMPLE), "--workdir", str(root), "--model", "mlp", "--once"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    call = json.loads(once.stdout.splitlines()[-1])
    assert once.returncode == 0 and call["ok"] and call["version"] == 2, once.stderr
