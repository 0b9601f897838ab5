"""edgetune.tvm_compat.native_warnings: TVM's C++ warnings go to file descriptor 2, past Python."""

from __future__ import annotations

import logging

import pytest
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.script import ir as I
from tvm.script import relax as R

from edgetune.tvm_compat.native_warnings import is_tvm_warning
from edgetune.tvm_compat.tensor_intrin import load_only

POOL_WARNING = 'Unknown schedule rule "meta_schedule.pool_max"'


def max_pool_design_space() -> None:
    """MetaSchedule warns (C++ LOG(WARNING)) that it has no rule a pooling kernel names."""

    @I.ir_module
    class MaxPool:
        @R.function
        def main(x: R.Tensor((1, 8, 16, 16), "float32")):
            return R.nn.max_pool2d(x, pool_size=(2, 2), strides=(2, 2))

    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    load_only("x86")  # TuneContext would import every architecture's intrinsics
    for task in ms.relax_integration.extract_tasks(relax.transform.LegalizeOps()(MaxPool), target):
        ms.TuneContext(
            task.dispatched[0],
            target=target,
            space_generator="post-order-apply",
            task_name=task.task_name,
            num_threads=1,
        ).generate_design_space()


@pytest.mark.xfail(strict=True, reason="TVM 0.27: LOG(WARNING) writes to descriptor 2, not to Python's logging")
def test_tvms_warnings_reach_pythons_logging(caplog):
    with caplog.at_level(logging.DEBUG):
        max_pool_design_space()
    assert any(POOL_WARNING in record.getMessage() for record in caplog.records)


def test_tvms_warnings_on_descriptor_2_are_told_apart(capfd):
    max_pool_design_space()
    lines = capfd.readouterr().err.encode().splitlines(keepends=True)
    assert [line for line in lines if POOL_WARNING.encode() in line and is_tvm_warning(line)]
    assert not is_tvm_warning(b"[02:26:14] /src/relax/vm.cc:12: Error: not a warning\n")
