"""Question: what does the quantize of an int8 model's epilogue gain by multiplying with the
float32 reciprocal of its scale instead of dividing by the scale (edgetune.compiler.integer),
and how often does the integer it rounds to differ? And what would a 256-entry table of the
whole SiLU (a function of the requantized byte, as onnxruntime's QLinearSigmoid looks it up) gain?

How: YOLOv8n's quantized epilogue after each integer convolution (requantize the accumulator,
SiLU as the QDQ graph computes it: dequantize, sigmoid, quantize, dequantize, multiply by the
dequantized input, quantize) over a 1x40x40x64 int32 accumulator, written twice in TE, once
dividing by the scales and once multiplying by their reciprocals, each one loop vectorized by
16 lanes, sigmoid's exp edgetune's vector exp (fast_math), compiled for the host alike; 1 thread.
The third kernel requantizes (with the reciprocal) and looks the rest up in a table of 256
bytes, the table computed by the reciprocal kernel's own arithmetic. Timed interleaved, ROUNDS rounds of SAMPLES samples of >= 20 ms; per round the ratio of
medians, then the median over rounds with a 95 % bootstrap interval. The integers both write
are compared over SEEDS random accumulators (scales from YOLOv8n's quantized model's range).

    .venv/bin/python bench/quantize_division.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import te, tirx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import machine_facts, round_ratio, sample_seconds, say  # noqa: E402

from edgetune.compiler.fast_math import exp_element  # noqa: E402

SHAPE = 40 * 40 * 64
LANES = 16
SAMPLES = 5
SEEDS = 3
# scale and zero point of the accumulator's requantize, the sigmoid's and the product's
SCALES = {"acc": 0.0004, "conv": 0.041, "sigmoid": 0.0039, "product": 0.037}
ZERO_POINTS = {"conv": 98, "sigmoid": 0, "product": 7}


def _f32(value: float) -> tirx.PrimExpr:
    return tirx.const(value, "float32")


def epilogue(how: str):
    """The compiled epilogue; `how` is "divide", "reciprocal" or "table" (a lookup after the
    requantize: main(acc, table, out))."""
    acc = te.placeholder((SHAPE,), "int32", name="acc")
    table = te.placeholder((256,), "uint8", name="table")

    def quantize(value, name):
        scale = SCALES[name]
        scaled = value / _f32(scale) if how == "divide" else value * _f32(float(np.float32(1) / np.float32(scale)))
        return tirx.max(tirx.min(tirx.round(scaled) + _f32(ZERO_POINTS[name]), _f32(255.0)), _f32(0.0))

    def dequantize(q, name):
        return (q - _f32(ZERO_POINTS[name])) * _f32(SCALES[name])

    def element(i):
        requantized = quantize(acc[i].astype("float32") * _f32(SCALES["acc"]), "conv")
        return table[requantized.astype("int32")] if how == "table" else silu(requantized)

    def silu(requantized):
        conv = dequantize(requantized, "conv")
        sigmoid = _f32(1.0) / (_f32(1.0) + exp_element(-conv))
        gate = dequantize(quantize(sigmoid, "sigmoid"), "sigmoid")
        return quantize(conv * gate, "product").astype("uint8")

    out = te.compute((SHAPE,), element, name="out")
    schedule = tvm.s_tir.Schedule(te.create_prim_func([acc, table, out]))
    (loop,) = schedule.get_loops(schedule.get_sblock("out"))
    schedule.vectorize(schedule.split(loop, [None, LANES])[1])
    return tvm.compile(schedule.mod, target=_host_target())


def _host_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 1})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    say(machine_facts())
    kernels = {how: epilogue(how) for how in ("divide", "reciprocal", "table")}
    table = silu_table(kernels["reciprocal"])
    rng = np.random.default_rng(0)
    differing = {"divide": 0, "table": 0}
    for _ in range(SEEDS):
        acc = tvm.runtime.tensor(rng.normal(0, 40_000, SHAPE).astype("int32"))
        written = {how: run(kernel, acc, table) for how, kernel in kernels.items()}
        for how in differing:
            differing[how] += int(np.count_nonzero(written[how] != written["reciprocal"]))
    for how, count in differing.items():
        say(f"integers that differ, {how} against reciprocal: {count} of {SEEDS * SHAPE}")
    acc = tvm.runtime.tensor(rng.normal(0, 40_000, SHAPE).astype("int32"))
    out = tvm.runtime.tensor(np.zeros(SHAPE, "uint8"))
    calls = {how: (lambda kernel=kernel: kernel["main"](acc, table, out)) for how, kernel in kernels.items()}
    samples = {how: [] for how in kernels}
    for index in range(args.rounds):
        for how in kernels if index % 2 == 0 else reversed(list(kernels)):
            samples[how].append([sample_seconds(calls[how], 20) for _ in range(SAMPLES)])
    for how, rounds in samples.items():
        flat = sorted(s for r in rounds for s in r)
        say(f"{how:>10}: median {flat[len(flat) // 2] * 1e3:.4f} ms (fastest {flat[0] * 1e3:.4f}, slowest {flat[-1] * 1e3:.4f}) "
            f"per {SHAPE} elements")  # fmt: skip
    for slower, faster in (("divide", "reciprocal"), ("reciprocal", "table")):
        ratio = round_ratio(samples[slower], samples[faster])
        low, high = ratio["ci95"]
        say(f"{slower} / {faster}: {ratio['median']:.2f}x [{low:.2f}-{high:.2f}], rounds {min(ratio['per_round']):.2f}-{max(ratio['per_round']):.2f}")


def run(kernel, acc, table) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros(SHAPE, "uint8"))
    kernel["main"](acc, table, out)
    return out.numpy()


def silu_table(reciprocal) -> tvm.runtime.Tensor:
    """The byte the reciprocal kernel writes after each requantized byte: accumulators that
    requantize to 0..255 exactly (acc * s_acc = (q - z) * s_conv)."""
    levels = np.arange(256, dtype=np.float32)
    acc = np.zeros(SHAPE, np.int32)
    acc[:256] = np.round((levels - ZERO_POINTS["conv"]) * np.float32(SCALES["conv"]) / np.float32(SCALES["acc"])).astype(np.int32)
    return tvm.runtime.tensor(run(reciprocal, tvm.runtime.tensor(acc), tvm.runtime.tensor(np.zeros(256, "uint8")))[:256])


if __name__ == "__main__":
    main()
