"""The built-in models written again in plain NumPy from their weights: a reference for TVM's
builds that shares no code with TVM (only the weights, from `builtin_weights`)."""

from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf)


def linear(w: dict, name: str, x: np.ndarray) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def relu6(x: np.ndarray) -> np.ndarray:
    return np.clip(x, 0.0, 6.0)


def conv2d(w: dict, name: str, x: np.ndarray, stride: int, padding: int, groups: int = 1) -> np.ndarray:
    """NCHW convolution, weight (out, in / groups, k, k), as a sum over the kernel offsets."""
    weight, bias = w[f"{name}.weight"], w[f"{name}.bias"]
    out_channels, per_group, k, _ = weight.shape
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    height = (x.shape[2] - k) // stride + 1
    width = (x.shape[3] - k) // stride + 1
    out = np.zeros((x.shape[0], out_channels, height, width))
    outs_per_group = out_channels // groups
    for o in range(out_channels):
        first_in = (o // outs_per_group) * per_group
        for i in range(k):
            for j in range(k):
                patch = x[
                    :,
                    first_in : first_in + per_group,
                    i : i + stride * height : stride,
                    j : j + stride * width : stride,
                ]
                out[:, o] += np.einsum("nchw,c->nhw", patch, weight[o, :, i, j])
    return out + bias[None, :, None, None]


def layer_norm(w: dict, name: str, x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mlp(w: dict, x: np.ndarray) -> np.ndarray:
    return linear(w, "fc2", np.maximum(linear(w, "fc1", x), 0.0))


def mobilenet_mini(w: dict, x: np.ndarray) -> np.ndarray:
    x = relu6(conv2d(w, "stem", x, stride=2, padding=1))
    for block, stride in (("block1", 1), ("block2", 2), ("block3", 1)):
        channels = x.shape[1]
        x = relu6(conv2d(w, f"{block}.depthwise", x, stride=stride, padding=1, groups=channels))
        x = relu6(conv2d(w, f"{block}.pointwise", x, stride=1, padding=0))
    return linear(w, "classifier", x.mean(axis=(2, 3)))


def transformer_block(w: dict, x: np.ndarray) -> np.ndarray:
    dim = x.shape[-1]
    q, k, v = np.split(linear(w, "qkv", layer_norm(w, "norm1", x)), 3, axis=-1)
    attention = softmax(q @ k.transpose(0, 2, 1) / math.sqrt(dim))
    x = x + linear(w, "proj", attention @ v)
    hidden = linear(w, "ff1", layer_norm(w, "norm2", x))
    return x + linear(w, "ff2", 0.5 * hidden * (1.0 + _erf(hidden / math.sqrt(2.0))))


FORWARD = {"mlp": mlp, "mobilenet-mini": mobilenet_mini, "transformer-block": transformer_block}
