"""Question: is a 3x3 stride-1 convolution faster computed by Winograd's F(4x4, 3x3), or a
1 x r one along a row by F(1x4, 1xr) (edgetune.compiler.winograd: an input transform, 36 or
r + 3 pointwise convolutions on the convolution rule, an output transform) than by the rule's
direct kernel, each tuned as a model's layer is?

How: for each shape, one NHWC layer as a model's interior layer is after import (a
convolution with a constant weight, bias, SiLU) is prepared for AVX-512 twice: with the Winograd
rewrite ("winograd") and with it switched off ("direct"). Every task of each arm is tuned on the
host, `--trials` trials per task (rule_kernels.tune); the arms are built with their best
records and timed whole (all their kernels, as the VM calls them) in `--rounds` interleaved
rounds, one thread: per round the fastest of 3 repeats of >= 50 ms. Both arms' outputs are
checked against NumPy in float64 first. GFLOP/s count the direct convolution's work. The
"winograd" arm rewrites every shape, also those below `prepare`'s threshold (MIN_PRODUCT_MACS),
which these measurements set.

    .venv/bin/python bench/winograd.py [--shapes 32x32@160,96x96@52,256x512@1x512k1x5] [--trials 16] [--rounds 9]

A shape is CINxCOUT@SIZE (a 3x3 filter on a square image) or CINxCOUT@HxWkKHxKW (256x512@1x512k1x5:
Magika's 5 taps along a row of 512), 'same' padding. The default shapes are the 3x3 stride-1
layers of OriNet and ddddocr-det and Magika's row (bench/HISTORY.md). No fleet: host only.
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy loads OpenBLAS
os.environ["TVM_NUM_THREADS"] = "1"

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rule_kernels  # noqa: E402
from _benchlib import PROFILE_AVX512, machine_facts, say  # noqa: E402

from edgetune.compiler import winograd  # noqa: E402
from edgetune.compiler.prepare import apply_database_and_build, extract_tasks, prepare  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402

DEFAULT_SHAPES = "32x32@160,64x64@80,128x128@40,256x256@20,48x48@52,96x96@52,96x96@26,96x96@13,192x192@13,24x24@104,256x512@1x512k1x5"


@dataclass(frozen=True)
class Layer:
    """A `kernel_h` x `kernel_w` convolution of `channels_in` x `channels_out` on a `height` x
    `width` image, 'same' padding."""

    channels_in: int
    channels_out: int
    height: int
    width: int
    kernel_h: int = 3
    kernel_w: int = 3

    @classmethod
    def parse(cls, text: str) -> Layer:
        found = re.fullmatch(r"(\d+)x(\d+)@(\d+)(?:x(\d+)k(\d+)x(\d+))?", text)
        if not found:
            raise SystemExit(f"--shapes: {text!r} is not CINxCOUT@SIZE or CINxCOUT@HxWkKHxKW (e.g. 96x96@52, 256x512@1x512k1x5)")
        cin, cout, height, width, kernel_h, kernel_w = found.groups()
        if width is None:
            return cls(int(cin), int(cout), int(height), int(height))
        return cls(int(cin), int(cout), int(height), int(width), int(kernel_h), int(kernel_w))

    @property
    def flops(self) -> int:
        return 2 * self.height * self.width * self.channels_out * self.channels_in * self.kernel_h * self.kernel_w

    @property
    def padding(self) -> tuple[int, int, int, int]:
        return (self.kernel_h // 2, self.kernel_w // 2) * 2

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (1, self.height, self.width, self.channels_in)

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(0)
        taps = self.kernel_h * self.kernel_w
        weight = rng.standard_normal((self.channels_out, self.kernel_h, self.kernel_w, self.channels_in))
        weight /= np.sqrt(taps * self.channels_in)
        return weight.astype(np.float32), (rng.standard_normal(self.channels_out) * 0.1).astype(np.float32)

    def module(self) -> tvm.IRModule:
        """The layer in Relax: conv2d NHWC/OHWI + bias, then SiLU as x * sigmoid(x)."""
        weight, bias = self.weights()
        builder = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(self.input_shape, "float32"))
        with builder.function("main", [x]):
            with builder.dataflow():
                conv = relax.op.nn.conv2d(x, relax.const(weight), padding=self.padding, data_layout="NHWC",
                                          kernel_layout="OHWI")  # fmt: skip
                biased = builder.emit(relax.op.add(conv, relax.const(bias)))
                out = builder.emit_output(relax.op.multiply(biased, relax.op.sigmoid(biased)))
            builder.emit_func_output(out)
        return builder.get()

    def reference(self, x: np.ndarray) -> np.ndarray:
        weight, bias = (w.astype(np.float64) for w in self.weights())
        top, left = self.padding[:2]
        padded = np.pad(x.astype(np.float64), [(0, 0), (top, top), (left, left), (0, 0)])
        out = sum(
            np.einsum("nhwc,oc->nhwo", padded[:, i : i + self.height, j : j + self.width, :], weight[:, i, j, :])
            for i in range(self.kernel_h)
            for j in range(self.kernel_w)
        ) + bias
        return out / (1 + np.exp(-out))


class Arm:
    """One way of computing the layer, tuned and built, timed on demand."""

    def __init__(self, layer: Layer, use_winograd: bool, target, trials: int, work: Path):
        eligible, least = winograd.eligible, winograd.MIN_PRODUCT_MACS
        winograd.eligible = eligible if use_winograd else (lambda call: False)
        winograd.MIN_PRODUCT_MACS = 0  # measured whether prepare would rewrite the layer or not
        try:
            prepared = prepare(layer.module(), target)
        finally:
            winograd.eligible, winograd.MIN_PRODUCT_MACS = eligible, least
        database = ms.database.MemoryDatabase()
        work.mkdir(parents=True)
        tasks = extract_tasks(prepared, target)
        for index, task in enumerate(tasks):
            say(f"  {task.task_name}: {trials} trials")
            records = rule_kernels.tune(task.dispatched[0], target, trials, work / f"task{index}")
            database.commit_workload(task.dispatched[0])
            database.commit_tuning_record(rule_kernels.best_after(records, trials))
        self.tasks = len(tasks)
        executable = apply_database_and_build(prepared, database, target)
        self.vm = relax.VirtualMachine(executable, tvm.cpu())
        x = np.random.default_rng(1).standard_normal(layer.input_shape).astype("float32")
        self.input = tvm.runtime.tensor(x)
        self.error = float(np.abs(self.vm["main"](self.input).numpy() - layer.reference(x)).max())
        self.samples: list[float] = []

    def time_once(self) -> None:
        timer = self.vm.time_evaluator("main", tvm.cpu(), number=10, repeat=3, min_repeat_ms=50)
        self.samples.append(min(timer(self.input).results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="CINxCOUT@SIZE, comma-separated")
    parser.add_argument("--trials", type=int, default=16, help="trials per task")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    target = build_target(load_profile(PROFILE_AVX512))
    work = Path(tempfile.mkdtemp(prefix="winograd-"))
    rows = []
    try:
        for text in args.shapes.split(","):
            layer = Layer.parse(text)
            arms = {}
            for name, use in (("direct", False), ("winograd", True)):
                say(f"{text} {name}")
                arms[name] = Arm(layer, use, target, args.trials, work / f"{text}-{name}")
            for _ in range(args.rounds):
                for arm in arms.values():
                    arm.time_once()
            rows.append((text, layer, arms))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{machine_facts()}; {args.trials} trials per task, {args.rounds} interleaved rounds")
    print("\n| layer | direct ms (GFLOP/s) | winograd ms (GFLOP/s) | direct / winograd | max error direct, winograd |")
    print("|---|---|---|---|---|")
    for text, layer, arms in rows:
        median = {name: statistics.median(arm.samples) for name, arm in arms.items()}
        cells = [f"{median[n] * 1e3:.3f} [{min(a.samples) * 1e3:.3f}-{max(a.samples) * 1e3:.3f}] "
                 f"({layer.flops / median[n] / 1e9:.0f})" for n, a in arms.items()]  # fmt: skip
        errors = ", ".join(f"{arm.error:.1e}" for arm in arms.values())
        print(f"| {text} | {cells[0]} | {cells[1]} | {median['direct'] / median['winograd']:.2f} | {errors} |")


if __name__ == "__main__":
    main()
