"""A small valid fleet.yaml (two classes, a simulated and a real board, a built-in and an ONNX
model) that inventory tests change one field of to see the loader's answer."""

from __future__ import annotations

from pathlib import Path

import onnx
import yaml
from onnx import TensorProto, helper

from support.tests_samples import FAKE_PRIVATE_KEY

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted((REPO / "device_profiles").glob("*.yaml"))


def base_fleet(tmp: Path) -> dict:
    key = tmp / "id_ed25519"
    key.write_text(FAKE_PRIVATE_KEY)
    key.chmod(0o600)
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        )
    )
    onnx.save(model, tmp / "relu.onnx")
    return {
        "version": 1,
        "name": "test-fleet",
        "workdir": "work",
        "sim": {"bridge": "etune-x0", "host_address": "10.231.99.1/24"},
        "trackers": [{"name": "host", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 9190}],
        "ssh": {"user": "root", "key": str(key), "known_hosts": "known_hosts"},
        "device_classes": [
            {"name": "avx512", "profile": str(REPO / "device_profiles/x86-avx512.yaml")},
            {"name": "rpi4", "profile": str(REPO / "device_profiles/rpi4.yaml")},
        ],
        "boards": [
            {
                "name": "b1",
                "address": "10.231.99.11",
                "device_class": "avx512",
                "tracker": "host",
                "python": "/usr/bin/python3",
                "workdir": "w/b1",
                "simulated": {"cpu_quota": 0.5},
            },
            {
                "name": "pi-1",
                "address": "pi-1.local",
                "device_class": "rpi4",
                "tracker": "host",
                "python": "/opt/tvm/bin/python",
                "workdir": "/var/lib/edgetune",
            },
        ],
        "models": [
            {"name": "mlp", "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256], "dtype": "float32"}]},
            {"name": "relu", "onnx": "relu.onnx", "inputs": [{"name": "x", "shape": [1, 4]}], "weight": 2},
        ],
        "tuning": {"trials_per_class": 64, "trials_per_iter": 16, "borrow": {"rpi4": "avx512"}},
        "artifacts": {"dir": "artifacts", "signing_key": "keys/signing.key", "public_key": "keys/signing.pub"},
    }


def write(tmp: Path, data: dict, name: str = "fleet.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
