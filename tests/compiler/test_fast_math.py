"""The fast legalizations of edgetune.compiler.relax.fast_math: no scalar libm call is left in the kernels,
and the values stay within float32 rounding of the exact functions (exp, erf, tanh, log: a few
ulp of float64 NumPy over every float32, edge cases included; sigmoid, softmax: relative)."""

from __future__ import annotations

import math
import re

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper
from support.onnx_samples import save
from tvm import relax, te

from edgetune.compiler.models import entry_function, load_model, reference_inputs
from edgetune.compiler.prepare import build_untuned, prepare
from edgetune.compiler.relax import fast_math
from edgetune.inventory.schema import Model, ModelInput

pytestmark = pytest.mark.tvm

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})
SHAPE = (1, 8, 16, 16)
# fast_exp's polynomial without FMA (x86-64-v2) was measured up to 5.1e-6 off the exact value (libm: 1.5e-7)
# where the result is tiny (below 1e-29); such values are compared absolutely, to ABSOLUTE_ERROR
RELATIVE_ERROR, ABSOLUTE_ERROR = 1e-5, 1e-20

# The element functions, their float64 references and their error bounds in ulp of the exact
# value. Measured on 400k float32 per sign in each of 8 ranges from the subnormals to 3e38
# (bench/vector_math.py --accuracy): exp 1.26, erf 2.64, tanh 1.33, log 1.20 ulp at most without
# FMA (x86-64-v2); exp 1.25, erf 2.39, tanh 1.33, log 1.19 with FMA (x86-64-v3).
ELEMENT_FUNCTIONS = {
    "exp": (fast_math.exp_element, np.exp, 2.0),
    "erf": (fast_math.erf_element, np.vectorize(math.erf, otypes=[np.float64]), 3.0),
    "tanh": (fast_math.tanh_element, np.tanh, 2.0),
    "log": (fast_math.log_element, np.log, 2.0),
}
# (mcpu, the packed multiply its vectorized loop must use): without FMA on SSE registers, with FMA on AVX's
VECTOR_UNITS = {"x86-64-v2": r"mulps\s+%xmm", "x86-64-v3": r"vfmadd\w*ps\s+%ymm"}
LANES, LENGTH = 8, 4 * 1024  # the test kernels' vector width and (static) array length


def vectorized_kernel(element, mcpu: str) -> tvm.runtime.Module:
    """y[i] = element(x[i]) over a float32 array of LENGTH, vectorized by LANES."""
    x = te.placeholder((LENGTH,), "float32", name="x")
    y = te.compute(x.shape, lambda i: element(x[i]), name="y")
    schedule = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = schedule.get_loops(schedule.get_sblock("y"))
    schedule.vectorize(schedule.split(loop, [None, LANES])[1])
    return tvm.compile(schedule.mod, target=tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 1}))


def assembly(module: tvm.runtime.Module) -> str:
    return "".join(m.inspect_source("asm") for m in [module.mod, *module.mod.imports] if m.kind == "llvm")


@pytest.fixture(
    scope="module", params=[(name, mcpu) for name in ELEMENT_FUNCTIONS for mcpu in VECTOR_UNITS], ids="-".join
)
def element_kernel(request):
    name, mcpu = request.param
    element, exact, max_ulps = ELEMENT_FUNCTIONS[name]
    kernel = vectorized_kernel(element, mcpu)

    def ours(x: np.ndarray) -> np.ndarray:
        out = tvm.runtime.tensor(np.empty_like(x))
        kernel(tvm.runtime.tensor(x), out)
        return out.numpy()

    return name, mcpu, kernel, ours, exact, max_ulps


def ulps_off(ours: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|ours - exact| in ulp of the float32 nearest to the float64 `exact`; where that float32
    is NaN or infinite, 0 if ours is the same and inf otherwise."""
    nearest = exact.astype(np.float32)
    special = ~np.isfinite(nearest)
    same_special = (ours == nearest) | (np.isnan(ours) & np.isnan(nearest))
    with np.errstate(invalid="ignore"):
        off = np.abs(ours.astype(np.float64) - exact) / np.spacing(np.abs(nearest)).astype(np.float64)
    return np.where(special, np.where(same_special, 0.0, np.inf), np.where(np.isnan(off), np.inf, off))


def test_the_vectorized_loop_calls_no_libm_and_uses_packed_instructions(element_kernel):
    name, mcpu, kernel, *_ = element_kernel
    code = assembly(kernel)
    assert re.search(VECTOR_UNITS[mcpu], code)
    assert f"{name}f" not in code  # libm's float32 function, called or jumped to


ANY_FLOAT32 = st.floats(width=32)  # subnormals, +-0, +-inf and NaN included
WHERE_IT_CURVES = st.floats(-12.0, 12.0, width=32)


@settings(max_examples=80, deadline=None)
@given(x=hnp.arrays(np.float32, LENGTH, elements=st.one_of(ANY_FLOAT32, WHERE_IT_CURVES)))
def test_each_function_is_within_its_ulp_bound_of_float64_numpy_everywhere(element_kernel, x):
    name, mcpu, _, ours, exact, max_ulps = element_kernel
    with np.errstate(all="ignore"):
        off = ulps_off(ours(x), exact(x.astype(np.float64)))
    worst = int(np.argmax(off))
    assert off[worst] <= max_ulps, f"{name} ({mcpu}) of {x[worst]!r}: {ours(x)[worst]!r}, {off[worst]:.2f} ulp off"


EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38], np.float32)
EXPECTED_AT_EDGES = {  # sign of zero included
    "exp": [1.0, 1.0, np.inf, 0.0, np.nan, 1.0, 1.0, np.inf, 0.0],
    "erf": [0.0, -0.0, 1.0, -1.0, np.nan, 1e-45, -1e-45, 1.0, -1.0],
    "tanh": [0.0, -0.0, 1.0, -1.0, np.nan, 1e-45, -1e-45, 1.0, -1.0],
    "log": [-np.inf, -np.inf, np.inf, np.nan, np.nan, -103.27893, np.nan, 88.72284, np.nan],
}


def test_each_function_answers_the_edge_cases_exactly(element_kernel):
    name, _, _, ours, *_ = element_kernel
    padded = np.concatenate([EDGES, np.zeros(LENGTH - len(EDGES), np.float32)])
    answers = ours(padded)[: len(EDGES)]
    expected = np.array(EXPECTED_AT_EDGES[name], np.float32)
    np.testing.assert_array_equal(answers, expected)
    assert np.array_equal(np.signbit(answers), np.signbit(expected))


def relax_gelu(op) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((LENGTH,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op(x)))
    return bb.get()


GELUS = {  # relax operator and its float64 definition
    "gelu": (relax.op.nn.gelu, lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))),
    "gelu_tanh": (
        relax.op.nn.gelu_tanh,
        lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    ),
}


@pytest.mark.parametrize("name", GELUS)
def test_relax_gelus_are_legalized_with_the_vector_functions(name):
    op, exact = GELUS[name]
    with HOST:
        legalized = fast_math.legalize_fast_math()(relax_gelu(op))
    executable = relax.build(legalized, target=HOST)
    assert "erff" not in assembly(executable) and "tanhf" not in assembly(executable)
    x = np.random.default_rng(0).standard_normal(LENGTH).astype(np.float32) * 4
    ours = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(ours, exact(x.astype(np.float64)), rtol=1e-6, atol=1e-6)


def conv_then(path, name: str, nodes: list, constants: dict[str, float]) -> Model:
    """conv 3x3 (8->8) whose output `c` feeds `nodes`, which end in `y`."""
    weight = np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3
    weights = [numpy_helper.from_array(weight, "w")] + [
        numpy_helper.from_array(np.array(value, np.float32), constant) for constant, value in constants.items()
    ]
    onnx = save(
        path,
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4), *nodes],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))],
        weights,
    )
    return Model(name, (ModelInput("x", SHAPE),), onnx=onnx)


def silu_model(path) -> Model:
    """SiLU (Sigmoid and Mul), as YOLO-family detectors follow every convolution."""
    return conv_then(
        path, "silu", [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])], {}
    )


def gelu_model(path) -> Model:
    """GELU as PyTorch exports it: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    nodes = [
        helper.make_node("Div", ["c", "sqrt2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["shifted"]),
        helper.make_node("Mul", ["c", "shifted"], ["doubled"]),
        helper.make_node("Mul", ["doubled", "half"], ["y"]),
    ]
    return conv_then(path, "gelu", nodes, {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5})


def mish_model(path) -> Model:
    """Mish as exporters without a Mish operator write it: x * tanh(log(1 + exp(x)))."""
    nodes = [
        helper.make_node("Exp", ["c"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Log", ["e1"], ["softplus"]),
        helper.make_node("Tanh", ["softplus"], ["t"]),
        helper.make_node("Mul", ["c", "t"], ["y"]),
    ]
    return conv_then(path, "mish", nodes, {"one": 1.0})


def one_node_model(path, op: str) -> Model:
    """`op` (Sigmoid, or Softmax over axis 1 as YOLOv8's box head has it) of one input."""
    nodes = [helper.make_node(op, ["x"], ["y"], **({"axis": 1} if op == "Softmax" else {}))]
    onnx = save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))],
        [],
    )
    return Model(op.lower(), (ModelInput("x", SHAPE),), onnx=onnx)


def built(model: Model):
    prepared = prepare(load_model(model), HOST)
    executable = build_untuned(prepared, HOST)
    return executable, relax.VirtualMachine(executable, tvm.cpu()), entry_function(prepared)


@pytest.mark.parametrize(
    ("make_model", "libm_functions"),
    [(silu_model, ["expf"]), (gelu_model, ["erff"]), (mish_model, ["expf", "logf", "tanhf"])],
    ids=["silu", "gelu", "mish"],
)
def test_a_model_calls_no_libm_function_and_answers_what_onnxruntime_answers(tmp_path, make_model, libm_functions):
    model = make_model(tmp_path / "model.onnx")
    executable, vm, entry = built(model)
    code = assembly(executable)
    assert "vfmadd" in code or "mulps" in code  # the kernel is in the library inspected
    for function in libm_functions:
        assert function not in code

    x = reference_inputs(model)["x"]
    ours = vm[entry](tvm.runtime.tensor(x)).numpy()
    theirs = ort.InferenceSession(str(model.onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=RELATIVE_ERROR, atol=1e-6)


@pytest.fixture(scope="module")
def sigmoid(tmp_path_factory):
    _, vm, entry = built(one_node_model(tmp_path_factory.mktemp("sigmoid") / "sigmoid.onnx", "Sigmoid"))
    return lambda x: vm[entry](tvm.runtime.tensor(x)).numpy()


@pytest.fixture(scope="module")
def softmax(tmp_path_factory):
    executable, vm, entry = built(one_node_model(tmp_path_factory.mktemp("softmax") / "softmax.onnx", "Softmax"))
    assert "expf" not in assembly(executable)
    return lambda x: vm[entry](tvm.runtime.tensor(x)).numpy()


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, SHAPE, elements=st.floats(-120, 120, width=32)))
def test_sigmoid_is_within_float32_rounding_of_the_exact_function_everywhere(sigmoid, x):
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    ours = sigmoid(x)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, exact, rtol=RELATIVE_ERROR, atol=ABSOLUTE_ERROR)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, SHAPE, elements=st.floats(-120, 120, width=32)))
def test_softmax_is_within_float32_rounding_of_the_exact_function_everywhere(softmax, x):
    shifted = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    exact = shifted / shifted.sum(axis=1, keepdims=True)
    ours = softmax(x)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, exact, rtol=RELATIVE_ERROR, atol=ABSOLUTE_ERROR)
