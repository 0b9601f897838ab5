"""Question: does a convolution whose output channels no full vector divides (24 on AVX-512's
16 float32 lanes, run today as 3 vectors of 8) gain from having its filters padded with zero
output channels up to a multiple of 16, the extra outputs sliced off inside the same kernel?

How: for each shape, two one-layer ONNX models (Conv + bias, then SiLU as Sigmoid * x; the
second with zero filters and bias up to `--padded` channels and a Slice back to the real
ones) are imported in NHWC as a model is, and their one kernel of the convolution rule is tuned
on the host, `--trials` trials each; the best record of each is built and the two are timed in
`--rounds` interleaved rounds (`rule_kernels.Kernel`: the fastest of 3 repeats of >= 50 ms per
round), one thread. GFLOP/s count the real channels' work only.

    .venv/bin/python bench/channel_padding.py [--shapes 12x24@208k3,24x24@104k3,48x24@104k1]
        [--padded 32] [--trials 16] [--rounds 9]

The default shapes are ddddocr-det's four slowest per FLOP (bench/README.md). No fleet: host only.
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
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rule_kernels  # noqa: E402
from _benchlib import PROFILE_AVX512, machine_facts, say  # noqa: E402

from edgetune.compiler.models import load_model  # noqa: E402
from edgetune.compiler.prepare import extract_tasks, prepare  # noqa: E402
from edgetune.compiler.schedule_rules import convolution  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.inventory.schema import Model, ModelInput  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A convolution: `channels_in` x `channels_out`, a square image of `size`, a `kernel` x
    `kernel` filter, stride 1, 'same' padding."""

    channels_in: int
    channels_out: int
    size: int
    kernel: int

    @classmethod
    def parse(cls, text: str) -> "Shape":
        found = re.fullmatch(r"(\d+)x(\d+)@(\d+)k(\d+)", text)
        if not found:
            raise SystemExit(f"--shapes: {text!r} is not CINxCOUT@SIZEkK (e.g. 12x24@208k3)")
        return cls(*(int(g) for g in found.groups()))

    @property
    def flops(self) -> int:
        return 2 * self.size * self.size * self.channels_out * self.channels_in * self.kernel**2

    def onnx(self, path: Path, padded: int | None) -> Path:
        """The layer as ONNX; with `padded`, its filters and bias padded with zeros to that many
        output channels and a Slice back to the real ones."""
        rng = np.random.default_rng(0)
        filters_out = padded or self.channels_out
        weight = np.zeros((filters_out, self.channels_in, self.kernel, self.kernel), np.float32)
        weight[: self.channels_out] = rng.standard_normal(weight[: self.channels_out].shape) * 0.1
        bias = np.zeros(filters_out, np.float32)
        bias[: self.channels_out] = rng.standard_normal(self.channels_out) * 0.1
        silu = "y0" if padded else "y"
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[self.kernel // 2] * 4),
                 helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], [silu])]  # fmt: skip
        constants = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")]
        if padded:
            constants += [numpy_helper.from_array(np.array(v, np.int64), n)
                          for n, v in (("starts", [0]), ("ends", [self.channels_out]), ("axes", [1]))]  # fmt: skip
            nodes.append(helper.make_node("Slice", [silu, "starts", "ends", "axes"], ["y"]))
        graph = helper.make_graph(
            nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.input_shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, self.channels_out, self.size, self.size])],
            constants,
        )  # fmt: skip
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    @property
    def input_shape(self) -> list[int]:
        return [1, self.channels_in, self.size, self.size]


def rule_kernel(shape: Shape, padded: int | None, target, work: Path):
    """The layer's kernel of the convolution rule, imported in NHWC as a model is."""
    path = shape.onnx(work / f"layer-{padded or 'plain'}.onnx", padded)
    model = Model(path.stem, (ModelInput("x", tuple(shape.input_shape)),), onnx=path, layout="NHWC")
    for task in extract_tasks(prepare(load_model(model), target), target):
        if convolution.RULE in task.dispatched[0].script():
            return task.task_name, task.dispatched[0]
    raise SystemExit(f"{shape}: the convolution rule takes no kernel of it (padded: {padded})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="12x24@208k3,24x24@104k3,48x24@104k1", help="CINxCOUT@SIZEkK, comma-separated")
    parser.add_argument("--padded", type=int, default=32, help="output channels the padded arm computes")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    target = build_target(load_profile(PROFILE_AVX512))
    work = Path(tempfile.mkdtemp(prefix="channel-padding-"))
    rows = []
    try:
        for text in args.shapes.split(","):
            shape = Shape.parse(text)
            kernels = {}
            for arm, padded in (("plain", None), ("padded", args.padded)):
                task_name, kernel = rule_kernel(shape, padded, target, work)
                say(f"{text} {arm}: {task_name}, {args.trials} trials")
                records = rule_kernels.tune(kernel, target, args.trials, work / f"{text}-{arm}")
                kernels[arm] = rule_kernels.Kernel(rule_kernels.best_after(records, args.trials), target)
            for _ in range(args.rounds):
                for timed in kernels.values():
                    timed.time_once()
            rows.append((text, shape, kernels))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{machine_facts()}; {args.trials} trials per arm, {args.rounds} interleaved rounds, padded to {args.padded}")
    print("\n| layer | plain ms (GFLOP/s) | padded ms (GFLOP/s) | plain / padded |\n|---|---|---|---|")
    for text, shape, kernels in rows:
        median = {arm: statistics.median(k.samples) for arm, k in kernels.items()}
        cells = [f"{median[arm] * 1e3:.3f} [{min(k.samples) * 1e3:.3f}-{max(k.samples) * 1e3:.3f}] "
                 f"({shape.flops / median[arm] / 1e9:.0f})" for arm, k in kernels.items()]  # fmt: skip
        print(f"| {text} | {cells[0]} | {cells[1]} | {median['plain'] / median['padded']:.2f} |")


if __name__ == "__main__":
    main()
