"""`edgetune_pipeline`: every step of `prepare` is a named pass that a PassContext sees, and
`prepare` runs exactly that pipeline."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi

from edgetune.compiler import edgetune_pipeline
from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import prepare
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})
MOBILENET = Model("mobilenet-mini", (ModelInput("x", (1, 3, 56, 56)),), builtin="mobilenet-mini")
STEPS = [
    "WinogradConvolutions",
    "PadOutputChannels",
    "FoldConstantsWithNumpy",
    "DecomposeOps",
    "CanonicalizeBindings",
    "LegalizeOps",
    "f_zero_pipeline",
    "AttachAttrLayoutFreeBuffers",
    "DropReorderedLayoutFreeWeights",
    "ScheduleConcatenations",
    "ScheduleSinglePixelConvolutions",
    "AnnotateConvolutions",
    "AnnotateDepthwise",
    "AnnotateIntegerConvolutions",
]
# The structural hash of MOBILENET prepared for AVX512 (TVM 0.27) when prepare's steps were still
# partly plain functions: the kernels, and so the workloads of class databases tuned then, are
# the same. A deliberate change of a step changes it; record the new hash with that change.
MOBILENET_AVX512_HASH = 17195961994449824637


@tvm.instrument.pass_instrument
class StepNames:
    """The names of the passes run right inside the outermost one (a pipeline's steps), in order."""

    def __init__(self) -> None:
        self.outermost: list[str] = []
        self.steps: list[str] = []
        self._depth = 0

    def run_before_pass(self, _mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        (self.outermost if self._depth == 0 else self.steps if self._depth == 1 else []).append(info.name)
        self._depth += 1

    def run_after_pass(self, _mod: tvm.IRModule, _info: tvm.transform.PassInfo) -> None:
        self._depth -= 1


def test_an_instrument_sees_every_step_of_prepare_by_name_in_order():
    mod = load_model(MOBILENET)
    names = StepNames()
    with tvm.transform.PassContext(instruments=[names]):
        prepare(mod, AVX512)
    assert names.outermost == ["EdgetunePipeline"]
    assert names.steps == STEPS


def test_prepare_is_the_pipeline_and_gives_the_module_it_gave_before():
    mod = load_model(MOBILENET)
    prepared = prepare(mod, AVX512)
    with AVX512:
        assert tvm_ffi.structural_equal(edgetune_pipeline(AVX512)(mod), prepared)
    assert tvm_ffi.structural_hash(prepared) == MOBILENET_AVX512_HASH


def test_a_step_disabled_by_name_is_left_out():
    """A PassContext's `disabled_pass` takes a step out by its name, e.g. to measure what it gains."""
    mod = load_model(MOBILENET)
    with tvm.transform.PassContext(disabled_pass=["AnnotateDepthwise"]):
        without = prepare(mod, AVX512)
    assert "edgetune_depthwise_nhwc" in prepare(mod, AVX512).script()
    assert "edgetune_depthwise_nhwc" not in without.script()
