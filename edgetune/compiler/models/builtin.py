"""Built-in reference models written with `tvm.relax.frontend.nn`, weights fixed by a seed.

They let the default fleet tune without downloading anything: an MLP, a small MobileNet-style
CNN (depthwise separable convolutions) and a small transformer encoder block. Each takes its
input shape from the inventory (its one positional input is called `x` in Relax) and is
exported with its weights bound as constants, so that only real kernels become tuning tasks
(with weights as parameters, MetaSchedule would tune their transposes as tasks).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from edgetune.errors import TuneError
from edgetune.inventory.schema import Model, ModelInput

WEIGHT_SEED = 20240531


class Mlp(nn.Module):
    """Two dense layers with a ReLU between them: features -> 2x features -> features."""

    def __init__(self, features: int) -> None:
        self.fc1 = nn.Linear(features, 2 * features)
        self.fc2 = nn.Linear(2 * features, features)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.fc2(nn.relu(self.fc1(x)))


class SeparableBlock(nn.Module):
    """MobileNet's depthwise 3x3 + pointwise 1x1 convolution, each followed by ReLU6."""

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        self.depthwise = nn.Conv2D(channels_in, channels_in, 3, stride=stride, padding=1, groups=channels_in)
        self.pointwise = nn.Conv2D(channels_in, channels_out, 1)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.relu6(self.pointwise(nn.relu6(self.depthwise(x))))


class MobileNetMini(nn.Module):
    """Stem conv 3x3/2, three separable blocks, global average pool, 10-way classifier."""

    def __init__(self, channels_in: int, classes: int = 10) -> None:
        self.stem = nn.Conv2D(channels_in, 16, 3, stride=2, padding=1)
        self.block1 = SeparableBlock(16, 32, stride=1)
        self.block2 = SeparableBlock(32, 64, stride=2)
        self.block3 = SeparableBlock(64, 64, stride=1)
        self.classifier = nn.Linear(64, classes)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = self.block3(self.block2(self.block1(nn.relu6(self.stem(x)))))
        pooled = nn.op.sum(x, axis=[2, 3]) * (1.0 / (x.shape[2] * x.shape[3]))
        return self.classifier(pooled)


class TransformerBlock(nn.Module):
    """A pre-norm encoder block: single-head self-attention and a 4x GELU feed-forward."""

    def __init__(self, dim: int) -> None:
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, 4 * dim)
        self.ff2 = nn.Linear(4 * dim, dim)
        self.dim = dim

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        q, k, v = nn.op.split(self.qkv(self.norm1(x)), 3, axis=-1)
        scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 2, 1])) * (1.0 / self.dim**0.5)
        x = x + self.proj(nn.op.matmul(nn.op.softmax(scores, axis=-1), v))
        return x + self.ff2(nn.gelu(self.ff1(self.norm2(x))))


def _mlp(inp: ModelInput) -> nn.Module:
    return Mlp(inp.shape[-1])


def _mobilenet_mini(inp: ModelInput) -> nn.Module:
    return MobileNetMini(inp.shape[1])


def _transformer_block(inp: ModelInput) -> nn.Module:
    return TransformerBlock(inp.shape[-1])


BUILDERS: dict[str, Callable[[ModelInput], nn.Module]] = {
    "mlp": _mlp,
    "mobilenet-mini": _mobilenet_mini,
    "transformer-block": _transformer_block,
}

EXPECTED_RANK = {"mlp": 2, "mobilenet-mini": 4, "transformer-block": 3}


def load_builtin(model: Model) -> tvm.IRModule:
    """The built-in model `model.builtin` at the inventory's input shape, weights bound."""
    if model.builtin not in BUILDERS:
        raise TuneError(f"model {model.name!r}: unknown built-in {model.builtin!r} (known: {', '.join(BUILDERS)})")
    if len(model.inputs) != 1 or len(model.inputs[0].shape) != EXPECTED_RANK[model.builtin]:
        raise TuneError(
            f"model {model.name!r}: built-in {model.builtin!r} takes one input of rank "
            f"{EXPECTED_RANK[model.builtin]}; fix its `inputs` in fleet.yaml"
        )
    mod, weights = _export(model)
    mod = relax.transform.BindParams("forward", {name: tvm.runtime.tensor(w) for name, w in weights.items()})(mod)
    return relax.transform.DeadCodeElimination(["forward"])(mod)


def builtin_weights(model: Model) -> dict[str, np.ndarray]:
    """The weights `load_builtin` binds, by parameter name (`fc1.weight`, `block2.depthwise.bias`, ...)."""
    return _export(model)[1]


def _export(model: Model) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    inp = model.inputs[0]
    module = BUILDERS[model.builtin](inp)
    module.to(inp.dtype)
    mod, params = module.export_tvm(spec={"forward": {"x": nn.spec.Tensor(list(inp.shape), inp.dtype)}})
    rng = np.random.default_rng(WEIGHT_SEED)
    return mod, {name: _initial_weight(rng, name, param) for name, param in params}


def _initial_weight(rng: np.random.Generator, name: str, param: nn.Parameter) -> np.ndarray:
    """He-style random weights (ones for norm scales, small biases), deterministic per seed."""
    shape = [int(d) for d in param.shape]
    if name.endswith("norm1.weight") or name.endswith("norm2.weight"):
        return np.ones(shape, dtype=param.dtype)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    scale = np.sqrt(2.0 / fan_in) if len(shape) > 1 else 0.05
    return (rng.standard_normal(shape) * scale).astype(param.dtype)
