"""Model inputs as users state them: rank-0 inputs, value ranges and fixed values, a reference
input file; `check` comparing them with the ONNX graph (exit 2), and `edgetune import`
printing an entry `check` accepts as is. Real ONNX files, built here with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from support.inventory_dump import fleet_to_dict
from support.inventory_files import base_fleet, write
from support.onnx_samples import write_separable_block

from edgetune.cli import main
from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import FixedValue, ValueRange


@pytest.fixture
def fleet_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def save_encoder(path, ids_dims=("batch", "sequence")):
    """input_ids (int64 [batch, sequence]) and a scalar sample rate, as exported models have them."""
    table = numpy_helper.from_array(np.ones((2, 4), np.float32), "table")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "token_type_ids"], ["embedded"], axis=0),
            helper.make_node("Cast", ["sr"], ["sr_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["embedded", "sr_float"], ["out"]),
        ],
        "encoder",
        [
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, list(ids_dims)),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[table],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def encoder_fleet(fleet_dir, inputs: list[dict], **model) -> dict:
    save_encoder(fleet_dir / "encoder.onnx")
    data = base_fleet(fleet_dir)
    data["models"][1] = {"name": "encoder", "onnx": "encoder.onnx", "inputs": inputs, **model}
    return data


GOOD_INPUTS = [
    {"name": "token_type_ids", "shape": [1, 8], "dtype": "int64", "values": {"range": [0, 1]}},
    {"name": "sr", "shape": [], "dtype": "int64", "values": {"fixed": 16000}},
]


def test_rank_0_inputs_values_and_reference_file_load_and_round_trip(fleet_dir, capsys):
    np.savez(fleet_dir / "ids.npz", token_type_ids=np.zeros((1, 8), np.int64))
    data = encoder_fleet(fleet_dir, GOOD_INPUTS, reference_input="ids.npz", quantized_weights="float")
    fleet = load_fleet(write(fleet_dir, data))
    model = fleet.models[1]
    assert model.inputs[0].values == ValueRange(0, 1)
    assert model.inputs[1].shape == () and model.inputs[1].values == FixedValue(16000)
    assert [i.name for i in model.fed_inputs] == ["token_type_ids"]
    assert model.reference_input == fleet_dir / "ids.npz" and model.quantized_weights == "float"
    again = load_fleet(write(fleet_dir, fleet_to_dict(fleet), "again.yaml"))
    assert again.replace(path=fleet.path) == fleet
    assert main(["check", "-f", "fleet.yaml"]) == 0
    assert "token_type_ids[1, 8]:int64 in [0, 1] sr[]:int64=16000" in capsys.readouterr().out


@pytest.mark.parametrize(
    "values,message",
    [
        ({"range": [1, 0]}, r"inputs\[0\].values.range: low must not exceed high, got \[1, 0\]"),
        ({"range": [0, 1.5]}, r"inputs\[0\].values.range\[1\]: must be an integer, got float 1.5"),
        ({"range": [0]}, r"inputs\[0\].values.range: must be \[low, high\]"),
        ({"fixed": 300}, None),
        ({"fixed": 1, "range": [0, 1]}, r"inputs\[0\].values: give exactly one of"),
        ({"between": [0, 1]}, r"inputs\[0\].values.between: unknown key"),
    ],
)
def test_bad_values_are_refused_with_their_path(fleet_dir, values, message):
    inputs = [{"name": "token_type_ids", "shape": [1, 8], "dtype": "int8", "values": values}, GOOD_INPUTS[1]]
    with pytest.raises(
        InventoryError, match=message or r"inputs\[0\].values.fixed: 300 does not fit in int8 \(from -128 to 127\)"
    ):
        load_fleet(write(fleet_dir, encoder_fleet(fleet_dir, inputs)))


@pytest.mark.parametrize(
    "high,message", [(".inf", r"must be a finite number, got .inf"), ("1.0e+39", r"1e\+39 does not fit in float32")]
)
def test_float_bounds_are_finite_numbers_the_dtype_holds(fleet_dir, high, message):
    gain = {"name": "gain", "shape": [], "dtype": "float32", "values": {"range": [0.5, "HIGH"]}}
    path = write(fleet_dir, encoder_fleet(fleet_dir, [*GOOD_INPUTS, gain]))
    path.write_text(path.read_text().replace("HIGH", high))
    with pytest.raises(InventoryError, match=r"fleet.yaml: models\[1\].inputs\[2\].values.range\[1\]: " + message):
        load_fleet(path)


@pytest.mark.parametrize(
    "arrays,message",
    [
        (
            {"token_type_ids": np.zeros((1, 7), np.int64)},
            r"array 'token_type_ids' is int64\[1, 7\], but the input is declared int64\[1, 8\]",
        ),
        ({"token_type_ids": np.zeros((1, 8), np.int32)}, r"array 'token_type_ids' is int32\[1, 8\]"),
        ({"input_ids": np.zeros((1, 8), np.int64)}, r"holds arrays input_ids that are not declared inputs"),
        ({}, r"has no array for input\(s\) token_type_ids"),
        (
            {"token_type_ids": np.full((1, 8), 5, np.int64)},
            r"array 'token_type_ids' holds values from 5 to 5, outside the declared range \[0, 1\]",
        ),
        (
            {"token_type_ids": np.zeros((1, 8), np.int64), "sr": np.array(8000, np.int64)},
            r"array 'sr' must hold the input's fixed value 16000",
        ),
    ],
)
def test_reference_file_is_checked_against_the_declared_inputs(fleet_dir, arrays, message):
    np.savez(fleet_dir / "ref.npz", **arrays)
    with pytest.raises(InventoryError, match=r"fleet.yaml: models\[1\].reference_input: " + message):
        load_fleet(write(fleet_dir, encoder_fleet(fleet_dir, GOOD_INPUTS, reference_input="ref.npz")))


def test_reference_file_that_is_not_npz_is_refused(fleet_dir):
    (fleet_dir / "ref.npz").write_bytes(b"not a zip")
    with pytest.raises(InventoryError, match=r"models\[1\].reference_input: .* is not a numpy .npz file"):
        load_fleet(write(fleet_dir, encoder_fleet(fleet_dir, GOOD_INPUTS, reference_input="ref.npz")))


@pytest.mark.parametrize(
    "change,declared,graph",
    [
        (
            {"name": "input_ids"},
            "input 'input_ids' is declared but the graph has no input of that name",
            "the graph's input 'token_type_ids' is not declared",
        ),
        (
            {"shape": [8]},
            "input 'token_type_ids' is declared with rank 1 (shape [8])",
            "rank 2 in the graph (token_type_ids: int64[batch, sequence])",
        ),
        (
            {"dtype": "int32", "values": {"range": [0, 1]}},
            "input 'token_type_ids' is declared int32",
            "is int64 in the graph",
        ),
    ],
)
def test_check_exits_2_naming_both_sides_and_listing_the_graphs_inputs(fleet_dir, capsys, change, declared, graph):
    inputs = [{**GOOD_INPUTS[0], **change}, GOOD_INPUTS[1]]
    write(fleet_dir, encoder_fleet(fleet_dir, inputs))
    assert main(["check", "-f", "fleet.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: fleet.yaml: models[1].inputs: model 'encoder'")
    assert declared in err and graph in err
    assert "The graph's inputs are: token_type_ids: int64[batch, sequence]; sr: int64[]" in err


def test_dynamic_dimensions_written_as_minus_one_are_not_fixed_sizes(fleet_dir, capsys):
    """Paddle2ONNX writes a dynamic dimension as dim_value -1 (PaddleOCR's models: x[-1, 3, ?, ?])."""
    write(fleet_dir, encoder_fleet(fleet_dir, GOOD_INPUTS))
    save_encoder(fleet_dir / "encoder.onnx", ids_dims=(-1, 8))
    assert main(["check", "-f", "fleet.yaml"]) == 0, capsys.readouterr().err
    save_encoder(fleet_dir / "encoder.onnx", ids_dims=(-1, 7))
    assert main(["check", "-f", "fleet.yaml"]) == 2
    assert "declared with shape [1, 8] but the graph fixes it to token_type_ids: int64[?, 7]" in capsys.readouterr().err


def test_import_prints_an_entry_check_accepts_as_is(fleet_dir, capsys):
    save_encoder(fleet_dir / "encoder.onnx")
    assert main(["import", "encoder.onnx", "--name", "bert-tiny"]) == 0
    entry = capsys.readouterr().out
    assert "dynamic dimension(s) batch, sequence set to 1" in entry
    assert entry.count("# FIX: integer input: declare the values it takes") == 2
    data = base_fleet(fleet_dir)
    data["models"][1:] = yaml.safe_load(entry)["models"]
    write(fleet_dir, data)
    assert main(["check", "-f", "fleet.yaml"]) == 0
    assert "bert-tiny" in capsys.readouterr().out


def test_import_of_a_file_that_is_not_onnx_is_a_clear_error(fleet_dir, capsys):
    (fleet_dir / "model.onnx").write_bytes(b"\x00\x01 not protobuf \xff")
    assert main(["import", "model.onnx"]) == 2
    assert "error: model.onnx: 'model.onnx' is not an ONNX model (DecodeError" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change,message",
    [
        ({"quantized_weights": "float"}, r"models\[0\].quantized_weights: applies to ONNX models only"),
        (
            {"inputs": [{"name": "x", "shape": [1, 256], "values": {"fixed": 1.0}}]},
            r"models\[0\].inputs\[0\].values: a fixed value is baked into an ONNX model",
        ),
    ],
)
def test_builtin_models_take_neither_fixed_inputs_nor_quantized_weights(fleet_dir, change, message):
    data = base_fleet(fleet_dir)
    data["models"][0].update(change)
    with pytest.raises(InventoryError, match=message):
        load_fleet(write(fleet_dir, data))


def test_integer_arithmetic_needs_the_nhwc_layout(fleet_dir):
    data = encoder_fleet(fleet_dir, GOOD_INPUTS, quantized_weights="integer")
    assert load_fleet(write(fleet_dir, data)).models[1].layout == "auto"  # the default: NHWC for integer
    data["models"][1]["layout"] = "NCHW"
    with pytest.raises(
        InventoryError,
        match=r"models\[1\].quantized_weights: 'integer' computes convolutions "
        r"in the NHWC micro-kernel; use 'layout: NHWC' or 'layout: auto' \(layout is NCHW\)",
    ):
        load_fleet(write(fleet_dir, data))
    data["models"][1]["layout"] = "NHWC"
    assert load_fleet(write(fleet_dir, data)).models[1].quantized_weights == "integer"


def test_a_model_needs_one_input_fed_at_run_time(fleet_dir):
    inputs = [{**GOOD_INPUTS[0], "values": {"fixed": 0}}, GOOD_INPUTS[1]]
    with pytest.raises(InventoryError, match=r"models\[1\].inputs: every input has a fixed value"):
        load_fleet(write(fleet_dir, encoder_fleet(fleet_dir, inputs)))


def test_reference_values_are_compared_as_the_file_stores_them(fleet_dir):
    """0.1 as float32 is 0.100000001: still within a declared range ending at 0.1."""
    gain = {"name": "gain", "shape": [], "dtype": "float32", "values": {"range": [0.0, 0.1]}}
    np.savez(fleet_dir / "ref.npz", token_type_ids=np.zeros((1, 8), np.int64), gain=np.float32(0.1))
    fleet = load_fleet(write(fleet_dir, encoder_fleet(fleet_dir, [*GOOD_INPUTS, gain], reference_input="ref.npz")))
    assert fleet.models[1].reference_input == fleet_dir / "ref.npz"


def test_layout_is_validated_and_round_trips(fleet_dir):
    data = base_fleet(fleet_dir)
    data["models"][0]["layout"] = "NHWC"
    fleet = load_fleet(write(fleet_dir, data))
    assert fleet.models[0].layout == "NHWC" and fleet.models[1].layout == "auto"  # the default
    assert fleet_to_dict(fleet)["models"][0]["layout"] == "NHWC"
    data["models"][0]["layout"] = "nchw16c"
    with pytest.raises(InventoryError, match=r"fleet.yaml: models\[0\].layout: .*'nchw16c'.*NCHW, NHWC"):
        load_fleet(write(fleet_dir, data))


def test_import_says_how_the_layout_of_graphs_with_convolutions_is_chosen(fleet_dir, capsys):
    write_separable_block(fleet_dir / "separable.onnx")
    save_encoder(fleet_dir / "encoder.onnx")
    assert main(["import", "separable.onnx"]) == 0
    assert "    # layout: auto  # the default: NHWC or NCHW chosen from the graph" in capsys.readouterr().out
    assert main(["import", "encoder.onnx"]) == 0
    assert "layout" not in capsys.readouterr().out
