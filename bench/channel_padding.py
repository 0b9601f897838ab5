"""Question: does a convolution whose output channels no full vector divides (24 on AVX-512's
16 float32 lanes, else run as 3 vectors of 8) gain from its filters padded with zero output
channels up to a multiple of the vector, the extra outputs sliced off inside the same kernel
(edgetune.compiler.channel_padding)?

How: for each shape, a one-layer ONNX model (Conv + bias, then SiLU as Sigmoid * x) is imported
in NHWC as a model is and prepared for the profile's target (AVX-512) twice: with the padding
("padded", as for full-width vector units) and with it switched off ("plain"). The kernel of the convolution rule of each is tuned on the host,
`--trials` trials each; the best record of each is built and the two are timed in `--rounds`
interleaved rounds (`rule_kernels.Kernel`: the fastest of 3 repeats of >= 50 ms per round), one
thread. GFLOP/s count the real channels' work only.

    .venv/bin/python bench/channel_padding.py [--shapes 12x24@208k3,24x24@104k3,48x24@104k1]
        [--trials 16] [--rounds 9] [--profile device_profiles/x86-zen4.yaml]

A shape is CINxCOUT@SIZEkK or CINxCOUT@HxWkKHxKW (960x60@1x40k1x3: a row of 40, a 1x3 filter).
The default shapes are ddddocr-det's three slowest per FLOP (bench/HISTORY.md). No fleet: host only.
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

from edgetune.compiler import channel_padding  # noqa: E402
from edgetune.compiler.models import load_model  # noqa: E402
from edgetune.compiler.prepare import extract_tasks, prepare  # noqa: E402
from edgetune.compiler.schedule_rules import convolution  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.inventory.schema import Model, ModelInput  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A convolution: `channels_in` x `channels_out`, an image of `height` x `width`, a
    `kernel_h` x `kernel_w` filter, stride 1, 'same' padding."""

    channels_in: int
    channels_out: int
    height: int
    width: int
    kernel_h: int
    kernel_w: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        """CINxCOUT@SIZEkK (a square image and filter) or CINxCOUT@HxWkKHxKW."""
        found = re.fullmatch(r"(\d+)x(\d+)@(\d+)(?:x(\d+))?k(\d+)(?:x(\d+))?", text)
        if not found:
            raise SystemExit(f"--shapes: {text!r} is not CINxCOUT@SIZEkK or CINxCOUT@HxWkKHxKW (e.g. 12x24@208k3, 960x60@1x40k1x3)")
        cin, cout, height, width, kernel_h, kernel_w = found.groups()
        return cls(int(cin), int(cout), int(height), int(width or height), int(kernel_h), int(kernel_w or kernel_h))

    @property
    def flops(self) -> int:
        return 2 * self.height * self.width * self.channels_out * self.channels_in * self.kernel_h * self.kernel_w

    def onnx(self, path: Path) -> Path:
        """The layer as ONNX."""
        rng = np.random.default_rng(0)
        weight = rng.standard_normal((self.channels_out, self.channels_in, self.kernel_h, self.kernel_w)) * 0.1
        bias = rng.standard_normal(self.channels_out) * 0.1
        pads = [self.kernel_h // 2, self.kernel_w // 2] * 2
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads),
                 helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]  # fmt: skip
        constants = [numpy_helper.from_array(weight.astype(np.float32), "w"),
                     numpy_helper.from_array(bias.astype(np.float32), "b")]  # fmt: skip
        graph = helper.make_graph(
            nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.input_shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, self.channels_out, self.height, self.width])],
            constants,
        )  # fmt: skip
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    @property
    def input_shape(self) -> list[int]:
        return [1, self.channels_in, self.height, self.width]


def rule_kernel(shape: Shape, padded: bool, target, work: Path):
    """The layer's kernel of the convolution rule, imported in NHWC and prepared as a model is,
    its output channels padded or not."""
    path = shape.onnx(work / "layer.onnx")
    model = Model(path.stem, (ModelInput("x", tuple(shape.input_shape)),), onnx=path, layout="NHWC")
    pad = channel_padding.padded_channels  # padded: as on a full-width datapath, whatever the target's
    channel_padding.padded_channels = (lambda call, lanes, _: pad(call, lanes, lanes)) if padded else (lambda *_: None)
    try:
        tasks = extract_tasks(prepare(load_model(model), target), target)
    finally:
        channel_padding.padded_channels = pad
    for task in tasks:
        if convolution.RULE in task.dispatched[0].script():
            return task.task_name, task.dispatched[0]
    raise SystemExit(f"{shape}: the convolution rule takes no kernel of it (padded: {padded})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="12x24@208k3,24x24@104k3,48x24@104k1", help="CINxCOUT@SIZEkK, comma-separated")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--profile", type=Path, default=PROFILE_AVX512,
                        help="the device profile whose target the kernels are built for (default x86-avx512)")
    args = parser.parse_args()
    target = build_target(load_profile(args.profile))
    work = Path(tempfile.mkdtemp(prefix="channel-padding-"))
    rows = []
    try:
        for text in args.shapes.split(","):
            shape = Shape.parse(text)
            kernels = {}
            for arm, padded in (("plain", False), ("padded", True)):
                task_name, kernel = rule_kernel(shape, padded, target, work)
                say(f"{text} {arm}: {task_name}, {args.trials} trials")
                kernels[arm] = rule_kernels.tuned_kernel(kernel, target, args.trials, work / f"{text}-{arm}")
            rule_kernels.time_in_rounds(kernels, args.rounds)
            rows.append((text, shape, kernels, task_name))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{machine_facts()}; {args.trials} trials per arm, {args.rounds} interleaved rounds")
    print("\n| layer | padded kernel | plain ms (GFLOP/s) | padded ms (GFLOP/s) | plain / padded |\n|---|---|---|---|---|")
    for text, shape, kernels, name in rows:
        median = {arm: statistics.median(k.samples) for arm, k in kernels.items()}
        cells = [f"{median[arm] * 1e3:.3f} [{min(k.samples) * 1e3:.3f}-{max(k.samples) * 1e3:.3f}] "
                 f"({shape.flops / median[arm] / 1e9:.0f})" for arm, k in kernels.items()]  # fmt: skip
        print(f"| {text} | {name} | {cells[0]} | {cells[1]} | {median['plain'] / median['padded']:.2f} |")


if __name__ == "__main__":
    main()
