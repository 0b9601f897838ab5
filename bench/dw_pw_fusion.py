"""Question: would fusing a depthwise 3x3 convolution with the pointwise 1x1 convolution after it
(one kernel, the depthwise output never written to memory) make depthwise-separable blocks
faster on this CPU? Issue 10's "depthwise + pointwise pairs" lever, measured before anything
is built for it (onnxruntime does not fuse such pairs; TVM's FuseOps cannot: both are
reductions).

How: one NHWC block per shape (H x W x C image, depthwise 3x3 stride 1 pad 1 + bias + ReLU,
then pointwise C -> N), float32, on the host, 1 thread, in the structure of edgetune's rules:
the pointwise convolution as the pointwise rule's register-tiled micro-kernel (R pixels of a
row x V vectors of 16 output channels, weights pre-packed), the depthwise one vectorized over
channels with its 3x3 taps unrolled.
- separate: the depthwise kernel writes its H x W x C output, the pointwise kernel reads it;
- fused: the pointwise kernel computes, for each tile of R pixels, the depthwise output of
  those pixels (all C channels) into a buffer of R x C right before the tile's reduction.
Both get the same search (every register tile that fits, the best of a first timing); then
the pair and the fused kernel are timed interleaved, ROUNDS rounds of >= 200 ms samples;
the ratio's median with a 95 % bootstrap interval over rounds. Outputs checked against NumPy.

    .venv/bin/python bench/dw_pw_fusion.py [--shapes HxWxCxN,...] [--rounds 9]
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy loads OpenBLAS

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import s_tir, te

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import machine_facts, round_ratio, sample_seconds, say  # noqa: E402

# PP-LCNet's separable blocks at 224x224 (and one map larger than this CPU's 1 MB L2 per core).
DEFAULT_SHAPES = "112x112x32x64,56x56x64x128,56x56x128x128,28x28x256x256,14x14x512x512,7x7x512x512"
LANES = 16
ROW_TILES, VECTOR_TILES = (4, 5, 6, 7, 8), (1, 2, 4)
MAX_ACCUMULATORS = 28
TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 1})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"blocks HxWxCxN (default {DEFAULT_SHAPES})")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--sample-ms", type=float, default=200.0, help="each sample loops this long (default 200)")
    return parser.parse_args()


class Block:
    """One depthwise-separable block: its TE computations, NumPy reference and device buffers."""

    def __init__(self, height: int, width: int, channels: int, outputs: int):
        self.h, self.w, self.c, self.n = height, width, channels, outputs
        self.x = te.placeholder((height, width, channels), "float32", name="x")
        self.depthwise_weight = te.placeholder((3, 3, channels), "float32", name="wd")
        self.depthwise_bias = te.placeholder((channels,), "float32", name="bd")
        self.pointwise_weight = te.placeholder((outputs // LANES, channels, LANES), "float32", name="wp")
        self.between = te.placeholder((height, width, channels), "float32", name="y")
        rng = np.random.default_rng(0)
        x, wd, bd = (rng.standard_normal(s, dtype=np.float32) for s in ((height, width, channels), (3, 3, channels), (channels,)))
        wp = rng.standard_normal((outputs, channels), dtype=np.float32)
        padded = np.pad(x, ((1, 1), (1, 1), (0, 0)))
        depthwise = sum(padded[i : i + height, j : j + width] * wd[i, j] for i in range(3) for j in range(3))
        self.expected = np.maximum(depthwise + bd, 0.0).reshape(-1, channels).astype(np.float64) @ wp.T.astype(np.float64)
        packed = np.ascontiguousarray(wp.reshape(outputs // LANES, LANES, channels).transpose(0, 2, 1))
        device = tvm.cpu()
        self.args = {name: tvm.runtime.tensor(a, device) for name, a in (("x", x), ("wd", wd), ("bd", bd), ("wp", packed))}
        self.middle = tvm.runtime.tensor(np.zeros((height, width, channels), np.float32), device)
        self.out = tvm.runtime.tensor(np.zeros((height, width, outputs), np.float32), device)

    @property
    def flops(self) -> int:
        return 2 * self.h * self.w * self.c * (9 + self.n)

    def tiles(self) -> list[tuple[int, int]]:
        return [(r, v) for r in ROW_TILES for v in VECTOR_TILES
                if self.w % r == 0 and self.n % (v * LANES) == 0 and r * v <= MAX_ACCUMULATORS]  # fmt: skip

    def depthwise(self, x: te.Tensor) -> te.Tensor:
        h, w, c = self.h, self.w, self.c
        padded = te.compute((h + 2, w + 2, c), lambda i, j, k: te.if_then_else(
            te.all(i >= 1, i <= h, j >= 1, j <= w), x[te.max(i - 1, 0), te.max(j - 1, 0), k], 0.0), name="pad")  # fmt: skip
        kh, kw = te.reduce_axis((0, 3), "kh"), te.reduce_axis((0, 3), "kw")
        acc = te.compute((h, w, c), lambda i, j, k: te.sum(padded[i + kh, j + kw, k] * self.depthwise_weight[kh, kw, k], axis=[kh, kw]),
                         name="dw")  # fmt: skip
        return te.compute((h, w, c), lambda i, j, k: te.max(acc[i, j, k] + self.depthwise_bias[k], 0.0), name="dw_out")

    def pointwise(self, y: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, self.c), "k")
        return te.compute((self.h, self.w, self.n), lambda i, j, n: te.sum(y[i, j, k] * self.pointwise_weight[n // LANES, k, n % LANES], axis=k),
                          name="pw")  # fmt: skip

    def error(self) -> float:
        return float(np.abs(self.out.numpy().reshape(-1, self.n) - self.expected).max() / np.abs(self.expected).max())


def schedule_pointwise(sch: s_tir.Schedule, rows: int, vectors: int) -> s_tir.LoopRV:
    """The pointwise rule's micro-kernel; returns the loop over a row's pixel tiles."""
    pw = sch.get_sblock("pw")
    tile = sch.cache_write(pw, 0, "global")
    height, width, channels, reduction = sch.get_loops(pw)
    pixel_tiles, row = sch.split(width, [None, rows])
    channel_tiles, vector, lane = sch.split(channels, [None, vectors, LANES])
    reduction, unit = sch.split(reduction, [None, 1])
    sch.reorder(height, pixel_tiles, channel_tiles, reduction, row, vector, unit, lane)
    sch.reverse_compute_at(tile, channel_tiles)
    sch.unroll(row)
    sch.unroll(vector)
    sch.vectorize(lane)
    sch.decompose_reduction(pw, reduction)
    *_, last = sch.get_loops(tile)
    sch.vectorize(sch.split(last, [None, LANES])[-1])
    return pixel_tiles


def schedule_depthwise(sch: s_tir.Schedule, at: s_tir.LoopRV | None) -> None:
    """Per output pixel, all channels in vectors, the 3x3 taps unrolled; computed under `at`
    (the fused kernel's pixel tiles) or as its own kernel."""
    out, dw = sch.get_sblock("dw_out"), sch.get_sblock("dw")
    if at is not None:
        sch.compute_at(out, at)
    sch.compute_at(dw, sch.get_loops(out)[-2])
    sch.compute_inline(sch.get_sblock("pad"))
    *_, channels, kh, kw = sch.get_loops(dw)
    sch.reorder(kh, kw, channels)
    sch.vectorize(sch.split(channels, [None, LANES])[-1])
    sch.unroll(kh)
    sch.unroll(kw)
    sch.decompose_reduction(dw, kh)
    *_, last = sch.get_loops(out)
    sch.vectorize(sch.split(last, [None, LANES])[-1])


def compiled(func: tvm.tirx.PrimFunc, schedule) -> tvm.runtime.Module:
    sch = s_tir.Schedule(func)
    schedule(sch)
    return tvm.compile(sch.mod, target=TARGET).mod


def best_of_tiles(block: Block, make_run, sample_ms: float):
    """The run of the best register tile (a first timing of each), and that tile."""
    timed = [(sample_seconds(run, sample_ms / 4), tile, run) for tile in block.tiles() for run in [make_run(tile)]]
    _, tile, run = min(timed, key=lambda t: t[0])
    return run, tile


def measure(block: Block, args) -> dict:
    a = block.args
    depthwise = compiled(te.create_prim_func([block.x, block.depthwise_weight, block.depthwise_bias, block.depthwise(block.x)]),
                         lambda sch: schedule_depthwise(sch, None))  # fmt: skip

    def separate(tile):
        pointwise = compiled(te.create_prim_func([block.between, block.pointwise_weight, block.pointwise(block.between)]),
                             lambda sch: schedule_pointwise(sch, *tile))  # fmt: skip
        return lambda: (depthwise(a["x"], a["wd"], a["bd"], block.middle), pointwise(block.middle, a["wp"], block.out))

    def fused(tile):
        func = te.create_prim_func([block.x, block.depthwise_weight, block.depthwise_bias, block.pointwise_weight,
                                    block.pointwise(block.depthwise(block.x))])  # fmt: skip
        kernel = compiled(func, lambda sch: schedule_depthwise(sch, schedule_pointwise(sch, *tile)))
        return lambda: kernel(a["x"], a["wd"], a["bd"], a["wp"], block.out)

    runs, tiles, errors = {}, {}, {}
    for name, make in (("separate", separate), ("fused", fused)):
        runs[name], tiles[name] = best_of_tiles(block, make, args.sample_ms)
        runs[name]()
        errors[name] = block.error()
    samples = {name: [] for name in runs}
    depthwise_alone = []
    for _ in range(args.rounds):
        for name, run in runs.items():
            samples[name].append([sample_seconds(run, args.sample_ms)])
        depthwise_alone.append(sample_seconds(lambda: depthwise(a["x"], a["wd"], a["bd"], block.middle), args.sample_ms))
    ms = {name: 1e3 * statistics.median(s[0] for s in samples[name]) for name in samples}
    return {"block": block, "ms": ms, "depthwise_ms": 1e3 * statistics.median(depthwise_alone), "tiles": tiles,
            "errors": errors, "speedup": round_ratio(samples["separate"], samples["fused"])}  # fmt: skip


def main() -> None:
    args = parse_args()
    blocks = []
    for text in args.shapes.split(","):
        block = Block(*(int(d) for d in text.split("x")))
        if not block.tiles():
            raise SystemExit(f"--shapes {text}: no register tile fits: W a multiple of 4-8, N of {LANES}")
        blocks.append(block)
    say(machine_facts())
    rows = []
    for block in blocks:
        rows.append(measure(block, args))
        r = rows[-1]
        say(f"{block.h}x{block.w}x{block.c}->{block.n}: separate {r['ms']['separate']:.4f} ms, fused {r['ms']['fused']:.4f} ms")
    print("\n| block HxWxC -> N | depthwise output MB | separate ms (its depthwise ms) | fused ms | fused GFLOP/s | separate / fused [95 %] | errors separate / fused |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        b, low, high = r["block"], *r["speedup"]["ci95"]
        print(f"| {b.h}x{b.w}x{b.c} -> {b.n} | {4 * b.h * b.w * b.c / 2**20:.2f} | {r['ms']['separate']:.4f} ({r['depthwise_ms']:.4f}) | "
              f"{r['ms']['fused']:.4f} | {b.flops / r['ms']['fused'] / 1e6:.0f} | {r['speedup']['median']:.3f}x [{low:.3f}-{high:.3f}] | "
              f"{r['errors']['separate']:.1e} / {r['errors']['fused']:.1e} |")  # fmt: skip


if __name__ == "__main__":
    main()
