"""`load_cpu_intrinsics` registers TVM's tensor intrinsics of the target's CPU only, in a fresh
process as a class process is: the x86 ones for an x86 target, the Arm ones for an aarch64
target, and never the whole package (whose GPU part takes tens of seconds to parse)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tvm  # each probe parses TVM's tensor intrinsics of a CPU: seconds

PROBE = """
import json, sys, tvm
from tvm.s_tir import TensorIntrin
from edgetune.compiler.intrinsics import load_cpu_intrinsics
load_cpu_intrinsics(tvm.target.Target(json.loads(sys.argv[1])))
loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("tvm.s_tir.tensor_intrin."))
def registered(name):
    try:
        TensorIntrin.get(name)
        return True
    except Exception:
        return False
print(json.dumps({"loaded": loaded, "x86_vnni": registered("dot_16x4_vnni"), "arm_dot": registered("dot_4x4_i8i8s32_sdot")}))
"""


@pytest.mark.parametrize(
    "target, module, x86, arm",
    [
        ({"kind": "llvm", "mcpu": "icelake-server"}, "x86", True, False),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"}, "arm_cpu", False, True),
    ],
)
def test_only_the_targets_cpu_intrinsics_are_loaded(target, module, x86, arm):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(target)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert module in found["loaded"] and "cuda" not in found["loaded"]
    assert (found["x86_vnni"], found["arm_dot"]) == (x86, arm)
