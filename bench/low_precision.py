"""Question: what would int8 (AVX-512 VNNI) buy on this CPU, against onnxruntime's own quantized
models as the peer, and at what accuracy change? Issue 10's last untried lever, measured before
anything is built for it.

Two parts, one run, on the host (no fleet), 1 thread:

1. The peer, per real model: onnxruntime's static quantizer (real_models.quantize:
   `quant_pre_process`, then `quantize_static`: QDQ format, uint8 activations, int8 weights
   per output channel, MinMax calibration on CALIBRATION seeded uniform [0, 1) inputs; opsets
   below 13 converted to 13 first) against the float32 model, both in onnxruntime (1 intra-op
   thread, ORT_ENABLE_ALL),
   timed interleaved in rounds (float, int8, float, ...; each sample the mean of a loop of
   >= --sample-ms), the ratio's median with a 95 % bootstrap interval over rounds. The accuracy
   change on HELD_OUT other seeded inputs: the int8 outputs' relative L2 error against the
   float ones, and for the classifiers and the recogniser (CLASS_SCORES) how often the arg-max
   over the last axis (the class; per text position for the recogniser) agrees. Random inputs
   are not the models' data (no image set is reachable here): calibration on them and agreement
   on them say less than real images would, and near-uniform scores make arg-max agreement low.
2. The kernel ceiling: pointwise convolutions of those models' shapes as GEMMs (M pixels x K
   input channels x N output channels) in the micro-kernel structure of edgetune's pointwise
   rule (a register tile of R pixels x V vectors of 16 output channels, accumulated over the
   whole reduction, weights pre-packed in the tile's order), written twice: float32 with FMAs
   (bias + ReLU epilogue), and uint8 x int8 -> int32 with VNNI `vpdpbusd` (16 outputs x 4
   inputs per instruction; requantize epilogue: per-channel scale, round, clamp to uint8, as
   QLinearConv). Both sides get the same search (every tile that fits, best of a first timing)
   and are then timed interleaved (float, int8, float, ...), ROUNDS rounds. Outputs are
   compared with NumPy's (the table's errors: largest difference over the largest value).
   The fp32 peak is OpenBLAS sgemm 1024^3 in the same run.

TVM 0.27's own VNNI intrinsic (`tvm.s_tir.tensor_intrin.x86.VNNI_DOT_16x4_INTRIN`) does not
compile with the LLVM 22 it ships: LLVM's `llvm.x86.avx512.vpdpbusd.512` now takes <64 x i8>
operands and the intrinsic passes <16 x i32> ("Call parameter type does not match function
signature"). The script uses edgetune's corrected one (edgetune.compiler.intrinsics.VNNI_DOT),
which passes the bytes. The bf16 counterpart (`vdpbf16ps`) could not be reached: TVM
legalizes bfloat16 on CPUs to uint16 storage and float32 arithmetic before code generation,
so the intrinsic gets <32 x i16> or <32 x float> operands; with both legalize passes disabled
the build crashed.

    .venv/bin/python bench/low_precision.py [--models yolov8n-320,...] [--rounds 9] [--shapes MxKxN,...]
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy loads OpenBLAS

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tvm
from tvm import s_tir, te

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from _benchlib import machine_facts, round_ratio, sample_seconds, say  # noqa: E402
from rule_kernels import sgemm_peak_gflops  # noqa: E402

from edgetune.compiler.intrinsics import VNNI_DOT as VNNI_INTRIN  # noqa: E402

DEFAULT_MODELS = "pplcnet-orientation,ppocr-cls,yolov8n-320,ppocr-det,ppocr-rec"
# Pointwise GEMMs (pixels x input channels x output channels) of YOLOv8n-320 and PP-LCNet.
DEFAULT_SHAPES = "6400x32x32,1600x64x64,400x128x128,100x256x256,784x64x128,196x256x256"
HELD_OUT = 32
# Models whose outputs are class scores over the last axis (per image, per text position).
CLASS_SCORES = {"pplcnet-orientation", "ppocr-cls", "ppocr-rec"}
LANES, DOT_INPUTS = 16, 4  # vpdpbusd: 16 int32 lanes, each the dot product of 4 byte pairs
ROW_TILES, VECTOR_TILES = (4, 5, 6, 7, 8), (1, 2, 4)
MAX_ACCUMULATORS = 28  # of AVX-512's 32 registers: the rest hold weights and the input
TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 1})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"real models (default {DEFAULT_MODELS})")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"GEMMs MxKxN (default {DEFAULT_SHAPES})")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--sample-ms", type=float, default=200.0, help="each sample loops this long (default 200)")
    return parser.parse_args()


# ------------------------------------------------------------------ part 1: the peer


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def accuracy_change(float_session, int8_session, feeds, class_scores: bool) -> dict:
    """The int8 outputs' relative L2 error against the float ones (over all feeds), and for
    class scores how often their arg-max over the last axis agrees."""
    error_sq, norm_sq, agree, compared = 0.0, 0.0, 0, 0
    for feed in feeds:
        for expected, got in zip(float_session.run(None, feed), int8_session.run(None, feed)):
            error_sq += float(np.square(got.astype(np.float64) - expected).sum())
            norm_sq += float(np.square(expected.astype(np.float64)).sum())
            if class_scores:
                agree += int((expected.argmax(-1) == got.argmax(-1)).sum())
                compared += expected.argmax(-1).size
    return {"relative_l2_error": (error_sq / max(norm_sq, 1e-30)) ** 0.5,
            "argmax_agreement": agree / compared if class_scores else None}


def interleaved(runs: dict[str, callable], rounds: int, sample_ms: float) -> dict[str, list[list[float]]]:
    """Per run, per round: one sample; the runs take turns in each round."""
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append([sample_seconds(run, sample_ms)])
    return samples


def peer_row(model: real_models.RealModel, work: Path, args) -> dict:
    source = real_models.fetch(model)
    started = time.time()
    quantized = real_models.quantize(model, source, work)
    quantize_s = time.time() - started
    float_session, int8_session = session(source), session(quantized)
    feed = real_models.random_feeds(model, 1, seed=2)[0]
    samples = interleaved({"float": lambda: float_session.run(None, feed), "int8": lambda: int8_session.run(None, feed)},
                          args.rounds, args.sample_ms)  # fmt: skip
    return {"model": model.name, "quantize_s": quantize_s,
            "float_ms": 1e3 * statistics.median(s[0] for s in samples["float"]),
            "int8_ms": 1e3 * statistics.median(s[0] for s in samples["int8"]),
            "speedup": round_ratio(samples["float"], samples["int8"]),
            **accuracy_change(float_session, int8_session, real_models.random_feeds(model, HELD_OUT, seed=3), model.name in CLASS_SCORES)}  # fmt: skip


# ------------------------------------------------------------------ part 2: the kernel ceiling


@dataclass(frozen=True)
class Gemm:
    pixels: int  # M
    channels_in: int  # K
    channels_out: int  # N

    @property
    def ops(self) -> int:
        return 2 * self.pixels * self.channels_in * self.channels_out

    def tiles(self) -> list[tuple[int, int]]:
        return [(r, v) for r in ROW_TILES for v in VECTOR_TILES
                if self.pixels % r == 0 and self.channels_out % (v * LANES) == 0 and r * v <= MAX_ACCUMULATORS]  # fmt: skip


def _float_gemm(g: Gemm) -> tvm.tirx.PrimFunc:
    x = te.placeholder((g.pixels, g.channels_in), "float32", name="x")
    w = te.placeholder((g.channels_out // LANES, g.channels_in, LANES), "float32", name="w")
    bias = te.placeholder((g.channels_out,), "float32", name="bias")
    k = te.reduce_axis((0, g.channels_in), "k")
    acc = te.compute((g.pixels, g.channels_out),
                     lambda m, n: te.sum(x[m, k] * w[n // LANES, k, n % LANES], axis=k), name="acc")  # fmt: skip
    out = te.compute(acc.shape, lambda m, n: te.max(acc[m, n] + bias[n], 0.0), name="out")
    return te.create_prim_func([x, w, bias, out])


def _int8_gemm(g: Gemm) -> tvm.tirx.PrimFunc:
    x = te.placeholder((g.pixels, g.channels_in), "uint8", name="x")
    w = te.placeholder((g.channels_out // LANES, g.channels_in // DOT_INPUTS, LANES, DOT_INPUTS), "int8", name="w")
    scale = te.placeholder((g.channels_out,), "float32", name="scale")
    k = te.reduce_axis((0, g.channels_in), "k")
    acc = te.compute(
        (g.pixels, g.channels_out),
        lambda m, n: te.sum(x[m, k].astype("int32") * w[n // LANES, k // DOT_INPUTS, n % LANES, k % DOT_INPUTS].astype("int32"), axis=k),
        name="acc")  # fmt: skip
    out = te.compute(acc.shape, lambda m, n: te.max(te.min(te.round(acc[m, n].astype("float32") * scale[n]), 255.0), 0.0).astype("uint8"),
                     name="out")  # fmt: skip
    return te.create_prim_func([x, w, scale, out])


def micro_kernel(func: tvm.tirx.PrimFunc, rows: int, vectors: int, dot_inputs: int) -> tvm.IRModule:
    """The pointwise rule's loop structure: tiles of `rows` x `vectors` x 16 accumulators over
    the whole reduction; the innermost 16 lanes (x `dot_inputs`) tensorized with VNNI when
    `dot_inputs` > 1, vectorized FMAs otherwise; the epilogue after each tile."""
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("acc")
    tile = sch.cache_write(acc, 0, "global")  # the accumulators; the VNNI description's scope
    pixels, channels, reduction = sch.get_loops(acc)
    pixel_blocks, row = sch.split(pixels, [None, rows])
    channel_blocks, vector, lane = sch.split(channels, [None, vectors, LANES])
    reduction, dot = sch.split(reduction, [None, dot_inputs])
    if dot_inputs > 1:  # the VNNI description: 16 lanes x 4 inputs
        sch.reorder(pixel_blocks, channel_blocks, reduction, row, vector, lane, dot)
    else:  # as the rule: a unit reduction loop above the vectorized lanes
        sch.reorder(pixel_blocks, channel_blocks, reduction, row, vector, dot, lane)
    sch.reverse_compute_at(tile, channel_blocks)
    sch.reverse_compute_inline(sch.get_sblock("out"))  # the epilogue, computed from the accumulators
    sch.unroll(row)
    sch.unroll(vector)
    if dot_inputs == 1:
        sch.vectorize(lane)  # before the init is split off: a vectorized reduction must own its init
    init = sch.decompose_reduction(acc, reduction)
    sch.vectorize(sch.get_loops(init)[-1])
    if dot_inputs > 1:
        sch.tensorize(lane, VNNI_INTRIN)  # after: the VNNI description has no init
    *_, tile_channels = sch.get_loops(tile)
    sch.vectorize(sch.split(tile_channels, [None, LANES])[-1])
    return sch.mod


class GemmKernel:
    """One precision of a GEMM: compiled for its best tile, its arguments, its NumPy check."""

    def __init__(self, g: Gemm, precision: str, sample_ms: float):
        rng = np.random.default_rng(0)
        self.gemm, self.precision, self.sample_ms = g, precision, sample_ms
        if precision == "float32":
            x = rng.standard_normal((g.pixels, g.channels_in), dtype=np.float32)
            w = rng.standard_normal((g.channels_out, g.channels_in), dtype=np.float32)
            bias = rng.standard_normal(g.channels_out, dtype=np.float32)
            packed = w.reshape(g.channels_out // LANES, LANES, g.channels_in).transpose(0, 2, 1)
            self.expected = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + bias, 0.0)
            host = (x, packed, bias, np.zeros((g.pixels, g.channels_out), np.float32))
            self.make, self.dot_inputs = _float_gemm, 1
        else:
            x = rng.integers(0, 256, (g.pixels, g.channels_in), dtype=np.uint8)
            w = rng.integers(-128, 128, (g.channels_out, g.channels_in), dtype=np.int8)
            scale = np.full(g.channels_out, 255.0 / (64 * 128 * g.channels_in**0.5), np.float32)
            packed = w.reshape(g.channels_out // LANES, LANES, g.channels_in // DOT_INPUTS, DOT_INPUTS).transpose(0, 2, 1, 3)
            acc = x.astype(np.int64) @ w.T.astype(np.int64)
            self.expected = np.clip(np.round(acc.astype(np.float32) * scale), 0, 255)
            host = (x, packed, scale, np.zeros((g.pixels, g.channels_out), np.uint8))
            self.make, self.dot_inputs = _int8_gemm, DOT_INPUTS
        self.args = [tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu()) for a in host]
        self.tile, self.run = self._best_tile()
        self.samples: list[list[float]] = []

    def _compiled(self, tile):
        return tvm.compile(micro_kernel(self.make(self.gemm), *tile, self.dot_inputs), target=TARGET).mod

    def _best_tile(self):
        timed = []
        for tile in self.gemm.tiles():
            kernel = self._compiled(tile)
            timed.append((sample_seconds(lambda: kernel(*self.args), self.sample_ms / 4), tile, kernel))
        _, tile, kernel = min(timed, key=lambda t: t[0])
        kernel(*self.args)
        self.error = float(np.abs(self.args[-1].numpy() - self.expected).max() / max(np.abs(self.expected).max(), 1e-12))
        self.vnni_instructions = kernel.inspect_source("s").count("vpdpbusd")
        return tile, lambda: kernel(*self.args)

    def time_once(self) -> None:
        self.samples.append([sample_seconds(self.run, self.sample_ms)])

    def ms(self) -> float:
        return 1e3 * statistics.median(s[0] for s in self.samples)


def kernel_rows(shapes: list[Gemm], args) -> list[dict]:
    rows = []
    for g in shapes:
        kernels = {p: GemmKernel(g, p, args.sample_ms) for p in ("float32", "int8")}
        for _ in range(args.rounds):
            for kernel in kernels.values():
                kernel.time_once()
        f, q = kernels["float32"], kernels["int8"]
        rows.append({"gemm": g, "float": f, "int8": q, "speedup": round_ratio(f.samples, q.samples)})
        say(f"{g.pixels}x{g.channels_in}x{g.channels_out}: float32 {f.ms():.4f} ms (tile {f.tile}), "
            f"int8 {q.ms():.4f} ms (tile {q.tile}, {q.vnni_instructions} vpdpbusd)")  # fmt: skip
    return rows


# ------------------------------------------------------------------ report


def _ratio(r: dict) -> str:
    low, high = r["ci95"]
    return f"{r['median']:.2f}x [{low:.2f}-{high:.2f}]"


def print_peer(rows: list[dict]) -> None:
    print("\n| model | onnxruntime float32 ms | onnxruntime int8 ms | int8 speed-up [95 %] | relative L2 error | arg-max agreement | quantize s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        agreement = "-" if r["argmax_agreement"] is None else f"{100 * r['argmax_agreement']:.1f} %"
        print(f"| {r['model']} | {r['float_ms']:.2f} | {r['int8_ms']:.2f} | {_ratio(r['speedup'])} | "
              f"{r['relative_l2_error']:.3f} | {agreement} | {r['quantize_s']:.0f} |")  # fmt: skip


def print_kernels(rows: list[dict], peak: float) -> None:
    print(f"\n| GEMM MxKxN | float32 ms (GFLOP/s, % of {peak:.0f}) | int8 VNNI ms (GOP/s, x fp32 peak) | int8 speed-up [95 %] | errors float / int8 |")
    print("|---|---|---|---|---|")
    for r in rows:
        g, f, q = r["gemm"], r["float"], r["int8"]
        f_rate, q_rate = g.ops / f.ms() / 1e6, g.ops / q.ms() / 1e6
        print(f"| {g.pixels}x{g.channels_in}x{g.channels_out} | {f.ms():.4f} ({f_rate:.0f}, {100 * f_rate / peak:.0f} %) | "
              f"{q.ms():.4f} ({q_rate:.0f}, {q_rate / peak:.2f}x) | {_ratio(r['speedup'])} | {f.error:.1e} / {q.error:.1e} |")  # fmt: skip


def main() -> None:
    args = parse_args()
    models = real_models.by_name(args.models.split(","))
    shapes = [Gemm(*(int(d) for d in s.split("x"))) for s in args.shapes.split(",")]
    bad = [g for g in shapes if not g.tiles() or g.channels_in % DOT_INPUTS]
    if bad:
        raise SystemExit(f"--shapes: no register tile fits {bad}: M a multiple of 4-8, N of 16, K of 4")
    say(machine_facts())
    peak = sgemm_peak_gflops()
    say(f"sgemm 1024^3 peak (OpenBLAS, 1 thread, best of 30): {peak:.1f} GFLOP/s")
    with tempfile.TemporaryDirectory(prefix="edgetune-low-precision-") as tmp:
        peer = [peer_row(model, Path(tmp), args) for model in models]
    kernels = kernel_rows(shapes, args)
    say(f"sgemm peak after: {sgemm_peak_gflops():.1f} GFLOP/s")
    print_peer(peer)
    print_kernels(kernels, peak)


if __name__ == "__main__":
    main()
