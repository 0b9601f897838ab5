"""TVM's and onnxruntime's warnings in a tuning run (MetaSchedule's `Unknown schedule rule` for
a pooling kernel, onnxruntime's `Removing initializer`), made for real, go to the class's log
file; Python's own lines and native errors stay on the console."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.script import ir as I
from tvm.script import relax as R

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.tune.native_log import native_warnings_to

POOL_WARNING = 'Unknown schedule rule "meta_schedule.pool_max"'
ORT_WARNING = "Removing initializer 'unused'"


def _onnx_with_an_unused_initializer() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "unused-initializer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "unused")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _max_pool_design_space() -> None:
    @I.ir_module
    class MaxPool:
        @R.function
        def main(x: R.Tensor((1, 8, 16, 16), "float32")):
            return R.nn.max_pool2d(x, pool_size=(2, 2), strides=(2, 2))

    mod = relax.transform.LegalizeOps()(MaxPool)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 1})
    load_cpu_intrinsics(target)  # TuneContext would import all of TVM's (minutes under load)
    for task in ms.relax_integration.extract_tasks(mod, target):
        ms.TuneContext(
            task.dispatched[0],
            target=target,
            space_generator="post-order-apply",
            task_name=task.task_name,
            num_threads=1,
        ).generate_design_space()


def test_native_warnings_go_to_the_log_and_the_rest_to_the_console(tmp_path, capfd):
    log = tmp_path / "logs" / "native.log"
    with native_warnings_to(log):
        ort.InferenceSession(_onnx_with_an_unused_initializer(), providers=["CPUExecutionProvider"])
        _max_pool_design_space()
        print("a progress line", file=sys.stderr, flush=True)
        os.write(2, b"[02:26:14] /src/relax/vm.cc:12: Error: a native error stays on the console\n")
    print("after the run", file=sys.stderr, flush=True)
    console = capfd.readouterr().err
    assert POOL_WARNING not in console and ORT_WARNING not in console
    assert (
        "a progress line" in console and "a native error stays on the console" in console and "after the run" in console
    )
    logged = log.read_text()
    assert POOL_WARNING in logged and ORT_WARNING in logged
    # the warning's indented continuation line went with it
    assert "\n  s_tir.meta_schedule.cpu.meta_schedule.pool_max" in logged and "pool_max\n" not in console
    assert "progress" not in logged and "native error" not in logged


def test_leaving_the_block_waits_for_its_lines_not_for_a_child_that_outlives_it(tmp_path, capfd):
    """A build or measurement worker started in a tuning run keeps the pipe open after the run
    (its pool is closed later, or never): the run ends once its own lines are passed on."""
    with native_warnings_to(tmp_path / "native.log"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        for n in range(5000):
            os.write(2, b"line %d of the run\n" % n)
        started = time.monotonic()
    try:
        left_after_s = time.monotonic() - started
        assert child.poll() is None  # still holding the pipe
    finally:
        child.kill()
        child.wait()
    console = capfd.readouterr().err
    assert all(f"line {n} of the run\n" in console for n in range(5000))
    # It waited for the pipe's end before (2 s, its bound), for a child like this one in every
    # class run; a thread's wake-up is milliseconds.
    assert left_after_s < 1.0, left_after_s
