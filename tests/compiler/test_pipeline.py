"""`import_pipeline` and `edgetune_pipeline`: every import-time rewrite of `load_model` and every
step of `prepare` is a named pass that a PassContext sees, `load_model` and `prepare` run exactly
those pipelines, and the modules they give are the ones class databases were tuned on."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from support.onnx_samples import write_quantized_silu

from edgetune.compiler import edgetune_pipeline, import_pipeline
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
    "ScheduleMoves",
    "ScheduleRowReductions",
    "ScheduleSinglePixelConvolutions",
    "AnnotateConvolutions",
    "AnnotateDepthwise",
    "AnnotateIntegerConvolutions",
]
INTEGER_IMPORT_STEPS = [
    "QuantizedMoves",
    "ElementWiseQuantization",
    "ConvertModelLayout",
    "IntegerConvolutions",
    "ByteTables",
]
# The structural hashes (TVM 0.27) of models as `load_model` imports them and as `prepare` then
# prepares them for AVX512, from before the import-time rewrites and prepare's steps were all
# passes: the kernels, and so the workloads of class databases tuned then, are the same. A
# deliberate change of a step changes them; record the new hashes with that change.
IMPORTED_AND_PREPARED_HASHES = {
    "mobilenet-mini": (7567320435817839126, 16797995190303710052),
    "silu-integer": (18202418072476589421, 3820340695428198173),
    "silu-keep": (16692640244695076068, 6385494143464057795),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Model]:
    """A built-in model (converted to NHWC) and a quantized ONNX one with its weights kept int8
    and computed in integers: between them every import-time rewrite does something."""
    silu = write_quantized_silu(tmp_path_factory.mktemp("qdq") / "silu.int8.onnx")
    inputs = (ModelInput("x", (1, 16, 8, 8)),)
    return {
        "mobilenet-mini": MOBILENET,
        "silu-integer": Model("silu", inputs, onnx=silu, quantized_weights="integer"),
        "silu-keep": Model("silu", inputs, onnx=silu),
    }


@tvm.instrument.pass_instrument
class StepNames:
    """The names of the outermost passes run, and of the passes run right inside the one named
    `pipeline` (its steps), in order."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.outermost: list[str] = []
        self.steps: list[str] = []
        self._running: list[str] = []

    def run_before_pass(self, _mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if not self._running:
            self.outermost.append(info.name)
        elif self._running[-1] == self.pipeline:
            self.steps.append(info.name)
        self._running.append(info.name)

    def run_after_pass(self, _mod: tvm.IRModule, _info: tvm.transform.PassInfo) -> None:
        self._running.pop()


def test_an_instrument_sees_every_step_of_prepare_by_name_in_order():
    mod = load_model(MOBILENET)
    names = StepNames("EdgetunePipeline")
    with tvm.transform.PassContext(instruments=[names]):
        prepare(mod, AVX512)
    assert names.outermost == ["EdgetunePipeline"]
    assert names.steps == STEPS


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("mobilenet-mini", ["GroupDequantizedWeights", "ConvertModelLayout"]),
        ("silu-keep", ["GroupDequantizedWeights", "ConvertModelLayout"]),
        ("silu-integer", INTEGER_IMPORT_STEPS),
    ],
)
def test_an_instrument_sees_the_import_passes_of_load_model_in_order(models, name, steps):
    names = StepNames("ImportPipeline")
    with tvm.transform.PassContext(instruments=[names]):
        load_model(models[name])
    assert names.outermost.count("ImportPipeline") == 1
    assert names.steps == steps


@pytest.mark.parametrize("name", sorted(IMPORTED_AND_PREPARED_HASHES))
def test_load_model_and_prepare_give_the_modules_they_gave_before(models, name):
    mod = load_model(models[name])
    prepared = prepare(mod, AVX512)
    with AVX512:
        assert tvm_ffi.structural_equal(edgetune_pipeline(AVX512)(mod), prepared)
    hashes = (tvm_ffi.structural_hash(mod), tvm_ffi.structural_hash(prepared))
    assert hashes == IMPORTED_AND_PREPARED_HASHES[name]


@pytest.mark.parametrize(("step", "kernel"), [("IntegerConvolutions", "integer_conv"), ("ByteTables", "byte_table")])
def test_an_import_pass_disabled_by_name_is_left_out(models, step, kernel):
    with_it = load_model(models["silu-integer"])
    with tvm.transform.PassContext(disabled_pass=[step]):
        without = load_model(models["silu-integer"])
    assert f"cls.{kernel}" in with_it.script()
    assert f"cls.{kernel}" not in without.script()


def test_the_import_pipeline_refuses_a_layout_or_arithmetic_it_does_not_know():
    with pytest.raises(ValueError, match="layout 'auto' is not one of NCHW, NHWC"):
        import_pipeline("auto", "keep")
    with pytest.raises(ValueError, match="quantized_weights 'int8' is not one of keep, float, integer"):
        import_pipeline("NHWC", "int8")


def test_a_step_disabled_by_name_is_left_out():
    """A PassContext's `disabled_pass` takes a step out by its name, e.g. to measure what it gains."""
    mod = load_model(MOBILENET)
    with tvm.transform.PassContext(disabled_pass=["AnnotateDepthwise"]):
        without = prepare(mod, AVX512)
    assert "edgetune_depthwise_nhwc" in prepare(mod, AVX512).script()
    assert "edgetune_depthwise_nhwc" not in without.script()
