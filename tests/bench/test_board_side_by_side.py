"""bench/board_side_by_side.py, the bench's timing process, run here as side_by_side.py runs it on
a board: onnxruntime and OpenVINO (both in this venv) answer the model's reference and are
timed in the same rounds; a runtime whose outputs miss the reference is not timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import openvino
from support.onnx_samples import write_conv_model

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "board_side_by_side.py"


def run_board_script(tmp_path: Path, shift: float) -> dict:
    """The script on the conv model, its reference onnxruntime's answer moved by `shift`."""
    model = write_conv_model(tmp_path / "conv.onnx", batch=1)
    feed = {"image": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    np.savez(tmp_path / "input.npz", **feed)
    (answer,) = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feed)
    np.savez(tmp_path / "expected.npz", output0=answer + shift)
    spec = {
        "libraries": {},
        "entry": "main",
        "onnx": str(model),
        "inputs": str(tmp_path / "input.npz"),
        "input_order": ["image"],
        "expected": str(tmp_path / "expected.npz"),
        "tolerance": 1e-4,
        "threads": 1,
        "rounds": 3,
        "round_ms": 5,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {"TVM_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_both_runtimes_answering_the_reference_are_timed_in_the_same_rounds(tmp_path):
    data = run_board_script(tmp_path, shift=0.0)
    assert data["not_timed"] == {}
    assert sorted(data["samples_ns"]) == ["onnxruntime", "openvino"]
    assert [len(rounds) for rounds in data["samples_ns"].values()] == [3, 3]
    assert all(calls and min(calls) > 0 for rounds in data["samples_ns"].values() for calls in rounds)
    assert data["versions"]["openvino"] == openvino.__version__.split("-")[0]


def test_runtimes_missing_the_reference_are_named_and_not_timed(tmp_path):
    data = run_board_script(tmp_path, shift=0.5)
    assert sorted(data["not_timed"]) == ["onnxruntime", "openvino"]
    assert all(0.49 < diff < 0.51 for diff in data["not_timed"].values())
    assert data["samples_ns"] == {}
