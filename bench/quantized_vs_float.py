"""A quantized (QDQ int8) model built two ways, timed side by side on one simulated board: int8
weights kept (edgetune's default, `quantized_weights: keep`) and widened to float32
(`quantized_weights: float`).

What it does, through edgetune's own library:
1. writes a QDQ int8 model with onnx.helper (fixed-seed weights): three linear layers
   1024 -> 2048 -> 2048 -> 1024 on 8 tokens, activations and weights quantized as onnxruntime's
   quantizer writes them (QuantizeLinear / DequantizeLinear around each MatMul);
2. brings up its own 1-class simulated fleet (2 boards, cpu quota 1.0 each, profile
   device_profiles/x86-avx512.yaml) and declares the model twice: `qdq-keep` and `qdq-float`;
3. tunes both for the class with `tune_fleet` (--trials per model, fresh database);
4. builds each tuned library with `prepare` + `apply_database_and_build`, exported with the
   host compiler like the artifact builder (the profile has no cross compiler);
5. times the two libraries on the boards through the tracker with `run_on_boards`, interleaved
   in turns as `edgetune build` times tuned against untuned, and checks both outputs against
   onnxruntime on the host;
6. prints library sizes (and their ratio to the ONNX file) and the time ratio; tears the fleet
   down (fleet down + sim down, always).

Run: .venv/bin/python bench/quantized_vs_float.py [--trials 64] [--rounds 4] [--keep-workdir]
Needs root (network namespaces, cgroups); holds /tmp/edgetune-bench.lock while running.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import numpy as np
from _benchlib import (
    PROFILE_AVX512,
    BoardSpec,
    bench_main,
    load_now,
    machine_facts,
    running_fleet,
    save_onnx,
    say,
    tune_or_stop,
    write_fleet_yaml,
)

CLASS = "bench-avx512"
TOKENS, SIZES = 8, (1024, 2048, 2048, 1024)
VARIANTS = {"qdq-keep": "keep", "qdq-float": "float"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64, help="tuning trials per variant (default 64)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved turns per library (default 4)")
    parser.add_argument("--repeat", type=int, default=5, help="samples per library per turn (default 5)")
    parser.add_argument("--min-repeat-ms", type=int, default=300, help="each sample loops at least this long (default 300)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the fleet's workdir (databases, libraries)")
    return parser.parse_args()


def make_qdq_onnx(path: Path) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    nodes, current = [], "tokens"
    weights = [numpy_helper.from_array(np.array(0.0213, np.float32), "act_scale"),
               numpy_helper.from_array(np.array(0, np.int8), "act_zero")]  # fmt: skip
    for layer, (k, n) in enumerate(zip(SIZES, SIZES[1:])):
        scale = rng.uniform(0.002, 0.004, size=n).astype(np.float32)  # per output channel, as the quantizer writes
        weights += [numpy_helper.from_array(rng.integers(-127, 128, size=(k, n)).astype(np.int8), f"w{layer}"),
                    numpy_helper.from_array(scale, f"w{layer}_scale"),
                    numpy_helper.from_array(np.zeros(n, np.int8), f"w{layer}_zero")]  # fmt: skip
        nodes += [
            helper.make_node("QuantizeLinear", [current, "act_scale", "act_zero"], [f"q{layer}"]),
            helper.make_node("DequantizeLinear", [f"q{layer}", "act_scale", "act_zero"], [f"dq{layer}"]),
            helper.make_node("DequantizeLinear", [f"w{layer}", f"w{layer}_scale", f"w{layer}_zero"], [f"wf{layer}"], axis=1),
            helper.make_node("MatMul", [f"dq{layer}", f"wf{layer}"], [f"mm{layer}"]),
            helper.make_node("Relu", [f"mm{layer}"], [f"h{layer}"]),
        ]
        current = f"h{layer}"
    graph = helper.make_graph(nodes, "qdq_mlp", [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [TOKENS, SIZES[0]])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [TOKENS, SIZES[-1]])], initializer=weights)
    return save_onnx(graph, path)


def main() -> None:
    bench_main("bench-qdq", parse_args(), run)


def run(args: argparse.Namespace, workdir: Path) -> None:
    from edgetune.inventory import load_fleet

    onnx_path = make_qdq_onnx(workdir / "qdq.onnx")
    models = [{"name": name, "onnx": "qdq.onnx", "quantized_weights": mode,
               "inputs": [{"name": "tokens", "shape": [TOKENS, SIZES[0]], "dtype": "float32"}]}
              for name, mode in VARIANTS.items()]  # fmt: skip
    tuning = {"trials_per_class": args.trials * len(models), "trials_per_iter": 8, "max_trials_per_task": 48}
    boards = [BoardSpec("qdq-1", CLASS, 1.0, 11), BoardSpec("qdq-2", CLASS, 1.0, 12)]
    fleet = load_fleet(write_fleet_yaml(workdir, "bench-qdq", {CLASS: PROFILE_AVX512}, boards, models, tuning))
    with running_fleet(fleet):
        tune_s = tune(fleet)
        libraries = {model.name: build(fleet, model, workdir) for model in fleet.models}
        runs = measure(fleet, libraries, args)
    report(args, fleet, onnx_path, libraries, runs, tune_s)


def tune(fleet) -> float:
    from edgetune.tune.tuner import TuneOptions

    say(f"tuning {CLASS}: {fleet.tuning.trials_per_class} trials for {len(fleet.models)} variants")
    started = time.monotonic()
    (result,) = tune_or_stop(fleet, TuneOptions(borrow=False)).classes
    if not result.ok:
        raise SystemExit(f"tuning failed: {result.error}")
    return time.monotonic() - started


def build(fleet, model, workdir: Path) -> Path:
    from edgetune.compiler.models import load_model
    from edgetune.compiler.prepare import (
        apply_database_and_build,
        count_tuned_tasks,
        prepare,
    )
    from edgetune.compiler.target import build_target
    from edgetune.tune.database import ClassDatabasePaths, open_for_build

    target = build_target(fleet.device_class(CLASS).profile)
    prepared = prepare(load_model(model), target)
    records = open_for_build(ClassDatabasePaths.of(fleet.workdir, CLASS))  # what `edgetune build` applies
    database = records.database
    coverage = count_tuned_tasks(prepared, database, target, records.kept_untuned)
    say(f"building {model.name}: {coverage.tuned}/{coverage.total} kernels have a record")
    library = workdir / f"{model.name}.so"
    apply_database_and_build(prepared, database, target).export_library(str(library))
    return library


def measure(fleet, libraries: dict[str, Path], args):
    from edgetune.artifact.measure import run_on_boards
    from edgetune.compiler.models import reference_inputs
    from edgetune.fleet.status import rpc_endpoint
    from edgetune.inventory.schema import CompareSettings, Measurement

    model = fleet.models[0]
    inputs = reference_inputs(model)
    measurement = Measurement(compare=CompareSettings(args.rounds, args.repeat, args.min_repeat_ms))
    runs = run_on_boards(rpc_endpoint(fleet, CLASS), fleet.boards_of(CLASS), libraries, "main",
                         [inputs[i.name] for i in model.inputs], measurement)  # fmt: skip
    gc.collect()  # closes the RPC sessions (see tuned_vs_untuned_vs_ort.py)
    if runs.failed:
        raise SystemExit(f"timing failed: {runs.failed}")
    return runs.succeeded, inputs


def report(args, fleet, onnx_path: Path, libraries: dict[str, Path], measured, tune_s: float) -> None:
    from tabulate import tabulate

    from edgetune.compiler.models import reference_outputs

    runs, inputs = measured
    expected = reference_outputs(fleet.models[0], inputs)[0]
    onnx_mb = onnx_path.stat().st_size / 1e6
    rows = []
    for board, results in sorted(runs.items()):
        keep, widened = results["qdq-keep"].timing, results["qdq-float"].timing
        for name, timing in (("qdq-keep", keep), ("qdq-float", widened)):
            size = libraries[name].stat().st_size / 1e6
            diff = float(np.max(np.abs(results[name].outputs["output0"] - expected)))
            rows.append([board, name, f"{size:.2f}", f"{size / onnx_mb:.2f}x", f"{timing.median_ms:.3f}",
                         f"{timing.iqr_ms:.3f}", f"{diff:.2g}"])  # fmt: skip
        rows.append([board, "float / keep time", "", "", f"{widened.median_ms / keep.median_ms:.2f}", "", ""])
    print()
    print("=" * 100)
    print(f"int8 weights kept vs widened to float32, tuned, on the boards of {CLASS}")
    print(f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; machine: {machine_facts()}, {load_now()}")
    print("=" * 100)
    print(tabulate(rows, headers=["board", "library", "MB", "vs ONNX file", "median ms", "IQR ms", "max |diff| vs ORT"],
                   disable_numparse=True))  # fmt: skip
    print()
    print(f"ONNX file {onnx_mb:.2f} MB; tuning {fleet.tuning.trials_per_class} trials in {tune_s:.0f} s "
          f"({args.trials} per variant); timing: {args.rounds} interleaved turns x {args.repeat} samples of "
          f">= {args.min_repeat_ms} ms per library and board")


if __name__ == "__main__":
    main()
