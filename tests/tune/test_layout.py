"""`models[].layout: NHWC`: the convolutions are compiled channels-last, each keeps its fused
activation (Clip and HardSwish included), and the model answers what onnxruntime answers."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax

from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.models import entry_function, load_model, reference_inputs, reference_outputs
from edgetune.tune.prepare import build_untuned, extract_tasks, prepare

from onnx_samples import conv_model, write_separable_block

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1})


def separable(tmp_path, layout: str) -> Model:
    return Model("separable", (ModelInput("image", (1, 3, 32, 32)),),
                 onnx=write_separable_block(tmp_path / "separable.onnx"), layout=layout)  # fmt: skip


def kernels(model: Model) -> list[str]:
    return [task.task_name for task in extract_tasks(prepare(load_model(model), HOST), HOST)]


def test_nhwc_keeps_each_activation_with_its_convolution_and_transposes_only_at_the_ends(tmp_path):
    nchw, nhwc = kernels(separable(tmp_path, "NCHW")), kernels(separable(tmp_path, "NHWC"))
    assert not any("transpose" in name for name in nchw)
    assert sum("transpose" in name for name in nhwc) == 2, nhwc  # the input's and the output's
    assert all("transpose" not in name for name in nhwc if "conv2d" in name), nhwc
    assert sum("conv2d" in name for name in nhwc) == sum("conv2d" in name for name in nchw) == 3
    convolutions = _conv_calls(load_model(separable(tmp_path, "NHWC")))
    assert len(convolutions) == 3 and {str(c.attrs.data_layout) for c in convolutions} == {"NHWC"}


def _conv_calls(mod: tvm.IRModule) -> list[relax.Call]:
    calls = []
    relax.analysis.post_order_visit(
        mod[entry_function(mod)],
        lambda e: calls.append(e) if isinstance(e, relax.Call) and e.op == tvm.ir.Op.get("relax.nn.conv2d") else None,
    )
    return calls


def test_nhwc_model_answers_what_onnxruntime_answers(tmp_path):
    model = separable(tmp_path, "NHWC")
    inputs = reference_inputs(model)
    prepared = prepare(load_model(model), HOST)
    vm = relax.VirtualMachine(build_untuned(prepared, HOST), tvm.cpu())
    got = vm[entry_function(prepared)](tvm.runtime.tensor(inputs["image"])).numpy()
    expected = reference_outputs(model, inputs)[0]
    assert got.shape == expected.shape == (1, 32, 1, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert float(np.abs(expected).max()) > 0.1  # the activations did not zero everything


def test_nchw_is_the_layout_the_graph_has_and_the_default(tmp_path):
    model = conv_model(tmp_path / "conv.onnx")
    assert model.layout == "NCHW"
    assert {str(c.attrs.data_layout) for c in _conv_calls(load_model(model))} == {"NCHW"}
    assert {str(c.attrs.data_layout) for c in _conv_calls(load_model(dataclasses.replace(model, layout="NHWC")))} == {"NHWC"}
