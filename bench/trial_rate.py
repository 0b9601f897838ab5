"""Trials per minute of a class run, before and after the trial-rate work, on one simulated
fleet, same model, same budget: A, MetaSchedule's evolutionary search at a fixed population of
128 with TVM's LocalBuilder (a fresh pool of build processes, each importing TVM, for every
batch), its runner's session per candidate, one search thread; B, the population sized to the
round (`SearchSettings.population_for`) and `PooledBuilder` (build processes kept for the run);
C, B with the runner's workers keeping their board's session across a batch
(`runner.HeldSession`); D, edgetune's defaults: C searching on every core the class has
(`SearchSettings.threads`; one class here, so all of the host's).

What it does, through edgetune's own library:
1. writes the bench's small ONNX CNN and brings up its own 1-class simulated fleet (2 boards,
   cpu quota 1.0 each, device_profiles/x86-64-v3.yaml);
2. tunes the class `--turns` times from an empty database each time, the settings taking turns
   (A B C D D C B A ...), each turn `tune_class` in this process (so MetaSchedule's profiler sees
   it) with `--trials-per-task` trials per task in rounds of `--trials-per-iter`;
3. prints, per setting, the median trials per minute of the class runs (class start to reports
   written) with min-max, the median of the model's best estimated latency at the end (what the
   trials bought: the sum of its tasks' best measured times), where one run of each spent its
   time (MetaSchedule's profiler: search, cost model, builds, measurement), and the start-up a
   class process pays before it tunes (a spawned process importing the tuner), measured once.

Run: .venv/bin/python bench/trial_rate.py [--turns 4] [--trials-per-task 16] [--population-a 128]
     [--settings ABCD] [--models cnn[,quantized]] [--profile device_profiles/x86-avx512.yaml]
(`--models cnn,quantized --settings D`: what a float and an integer trial cost with the defaults.)
Needs root (network namespaces, cgroups); holds /tmp/edgetune-bench.lock while running.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from _benchlib import (
    ONNX_CNN_INPUT,
    REPO,
    BoardSpec,
    bench_main,
    load_now,
    machine_facts,
    make_cnn_onnx,
    running_fleet,
    say,
    write_fleet_yaml,
)

CLASS = "bench-rate"
PROFILE = REPO / "device_profiles" / "x86-64-v3.yaml"  # AVX2 + FMA: every x86 host here runs it
PROFILE_ROWS = 8  # the profiler's largest entries shown per setting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4, help="class runs per setting (interleaved)")
    parser.add_argument("--trials-per-task", type=int, default=16)
    parser.add_argument("--trials-per-iter", type=int, default=16)
    parser.add_argument("--population-a", type=int, default=128, help="setting A's fixed population")
    parser.add_argument("--settings", default="ABCD", help="which settings to run, e.g. D for the defaults alone")
    parser.add_argument(
        "--models",
        default="cnn",
        help="comma-separated: cnn (float), quantized (a QDQ block built with `quantized_weights: integer`)",
    )
    parser.add_argument("--profile", type=Path, default=PROFILE, help="the class's device profile")
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args()
    bench_main("trial-rate", args, run)


def run(args: argparse.Namespace, workdir: Path) -> None:
    from edgetune.inventory import load_fleet
    from edgetune.tune.candidate_builder import make_builder
    from edgetune.tune.runner import make_runner
    from edgetune.tune.tuner import SearchSettings

    facts = machine_facts()
    models = [_model_entry(model, workdir) for model in args.models.split(",")]
    tuning = {"trials_per_task": args.trials_per_task, "trials_per_iter": args.trials_per_iter, "early_stop": None}
    boards = [BoardSpec("rate-1", CLASS, 1.0, 11), BoardSpec("rate-2", CLASS, 1.0, 12)]
    fleet = load_fleet(write_fleet_yaml(workdir, "bench-rate", {CLASS: args.profile.resolve()}, boards, models, tuning))
    one_thread = SearchSettings(num_threads=1)
    every_setting = {
        "A": Setting(replace(one_thread, population_size=args.population_a), _local_builder, _session_per_candidate),
        "B": Setting(one_thread, make_builder, _session_per_candidate),
        "C": Setting(one_thread, make_builder, make_runner),
        "D": Setting(SearchSettings(), make_builder, make_runner),
    }
    settings = {label: every_setting[label] for label in args.settings}
    runs = [(label, model["name"]) for label in settings for model in models]  # each a row of the report
    order = [tuple(runs) if turn % 2 == 0 else tuple(reversed(runs)) for turn in range(args.turns)]
    rates: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    estimates: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    profiles: dict[tuple[str, str], tuple[int, dict[str, float]]] = {}
    start_up_s = _process_start_up_s()
    with running_fleet(fleet):
        for turn in order:
            for label, model in turn:
                trials, seconds, estimate_s, profile = _one_run(fleet, model, settings[label])
                rates[label, model].append(trials / seconds * 60)
                estimates[label, model].append(estimate_s * 1000)
                profiles.setdefault((label, model), (trials, profile))
                say(f"{label} {model}: {trials} trials in {seconds:.0f} s: {rates[label, model][-1]:.1f} trials/min")
    _report(args, facts, fleet, settings, rates, estimates, profiles, start_up_s)


def _model_entry(model: str, workdir: Path) -> dict:
    """The fleet.yaml entry of the bench's `model`, its ONNX file written into `workdir`."""
    if model == "cnn":
        make_cnn_onnx(workdir / "cnn.onnx")
        name, shape = ONNX_CNN_INPUT
        return {"name": "cnn", "onnx": "cnn.onnx", "inputs": [{"name": name, "shape": list(shape), "dtype": "float32"}]}
    if model == "quantized":
        sys.path.insert(0, str(REPO / "tests"))  # the tests' QDQ sample, quantized by onnxruntime
        from support.onnx_samples import write_quantized_separable

        write_quantized_separable(workdir / "quantized.onnx")
        return {
            "name": "quantized",
            "onnx": "quantized.onnx",
            "layout": "NHWC",
            "quantized_weights": "integer",
            "inputs": [{"name": "x", "shape": [1, 16, 8, 8], "dtype": "float32"}],
        }
    raise SystemExit(f"--models: unknown model {model!r}; known: cnn, quantized")


@dataclass(frozen=True)
class Setting:
    search: object  # edgetune's SearchSettings
    builder: Callable  # make_builder's signature: (artifact_dir, cross_compiler, max_workers) -> Builder
    runner: Callable  # make_runner's signature: (endpoint, boards, measurement, index_bounds) -> RPCRunner


def _session_per_candidate(endpoint, boards: int, measurement, index_bounds):
    """edgetune's runner with MetaSchedule's own session handling: a session per candidate."""
    from edgetune.tune.runner import make_runner

    runner = make_runner(endpoint, boards, measurement, index_bounds)
    runner.f_create_session = runner.f_upload_module = runner.f_cleanup = None
    return runner


def _local_builder(artifact_dir: str, cross_compiler: str | None, max_workers: int):
    """TVM's LocalBuilder with edgetune's build and export (the builder of the class runs before
    `PooledBuilder`), with the `close()` the class run calls."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    from edgetune.tune.candidate_builder import BUILD_TIMEOUT_S, FastBuild, SharedLibraryExport

    @derived_object
    class PoolPerBatch(ms.builder.PyBuilder):
        def __init__(self, local: ms.builder.LocalBuilder) -> None:
            super().__init__()
            self.local = local

        def build(self, build_inputs):
            return self.local.build(build_inputs)

        def close(self) -> None:
            """LocalBuilder's pools end with each batch."""

    return PoolPerBatch(
        ms.builder.LocalBuilder(
            max_workers=max_workers,
            timeout_sec=BUILD_TIMEOUT_S,
            f_build=FastBuild(),
            f_export=SharedLibraryExport(artifact_dir, cross_compiler),
        )
    )


def _one_run(fleet, model: str, setting: Setting) -> tuple[int, float, float, dict[str, float]]:
    """One class run of `model` from an empty database: (trials, seconds, the model's best
    estimated latency in seconds, profiler seconds by scope)."""
    import json
    from unittest import mock

    from tvm.s_tir import meta_schedule as ms

    from edgetune.tune.database import ClassDatabasePaths
    from edgetune.tune.stop import stop_requested, tuning
    from edgetune.tune.tuner import TuneOptions, tune_class

    shutil.rmtree(ClassDatabasePaths.of(fleet.workdir, CLASS).directory, ignore_errors=True)
    with (
        tuning(),
        ms.Profiler() as profiler,  # a SIGTERM or Ctrl-C asks for a stop, as in `tune`
        mock.patch("edgetune.tune.tuner.make_builder", setting.builder),
        mock.patch("edgetune.tune.tuner.make_runner", setting.runner),
    ):
        result = tune_class(fleet, CLASS, TuneOptions(models=(model,), search=setting.search))
    if stop_requested():
        raise SystemExit("stopped during tuning")
    if not result.ok:
        raise SystemExit(f"tuning failed: {result.error}")
    estimate_s = json.loads(Path(result.summaries[0]).read_text())["estimated_latency_s"]
    return result.trials_run, result.tuning_time_s, estimate_s, {k: float(v) for k, v in profiler.get().items()}


def _import_tuner() -> None:
    import edgetune.tune.tuner  # noqa: F401 -- what a class process imports before it tunes


def _process_start_up_s() -> float:
    """Seconds a spawned class process takes to start and import the tuner (TVM included)."""
    started = time.monotonic()
    process = multiprocessing.get_context("spawn").Process(target=_import_tuner)
    process.start()
    process.join()
    return time.monotonic() - started


def _report(args, facts, fleet, settings, rates, estimates, profiles, start_up_s) -> None:
    per_iter = args.trials_per_iter
    print()
    print(f"machine: {facts}; {load_now()}")
    print(
        f"fleet: class {CLASS} ({args.profile.name}), {len(fleet.boards)} simulated boards (quota 1.0), "
        f"models {args.models} ({args.trials_per_task} trials per task, rounds of {per_iter}, no early stop)"
    )
    print(f"class process start-up (spawn + import of the tuner), once: {start_up_s:.1f} s")
    print(
        f"{'setting':<84} {'model':>10} {'trials/min median':>18} {'min-max':>14} {'runs':>5} "
        f"{'best est. ms':>13} {'build s/trial':>14}"
    )
    for (label, model), values in rates.items():
        setting = settings[label]
        search, builder = setting.search, "LocalBuilder" if setting.builder is _local_builder else "PooledBuilder"
        sessions = "session per candidate" if setting.runner is _session_per_candidate else "held sessions"
        described = (
            f"{label}: population {search.population_for(per_iter)}, {builder}, {sessions}, "
            f"{search.threads()} search threads"
        )
        trials, profile = profiles[label, model]
        print(
            f"{described:<84} {model:>10} {statistics.median(values):>18.1f} "
            f"{f'{min(values):.1f}-{max(values):.1f}':>14} {len(values):>5} "
            f"{statistics.median(estimates[label, model]):>13.3f} {profile.get('SendToBuilder', 0.0) / trials:>14.3f}"
        )
    for later, earlier in (("B", "A"), ("C", "B"), ("D", "C"), ("D", "A")):
        for model in {model for _, model in rates}:
            if (later, model) in rates and (earlier, model) in rates:
                ratio = statistics.median(rates[later, model]) / statistics.median(rates[earlier, model])
                print(f"{later} / {earlier} ({model}): {ratio:.2f}x trials per minute (medians)")
    for (label, model), (_, profile) in profiles.items():
        total = profile.get("Total", sum(profile.values()))
        print(f"where the first {label} {model} run spent its time (MetaSchedule profiler, {total:.0f} s in its loop):")
        for scope, seconds in sorted(profile.items(), key=lambda kv: -kv[1])[:PROFILE_ROWS]:
            print(f"  {scope:<50} {seconds:8.1f} s")


if __name__ == "__main__":
    main()
