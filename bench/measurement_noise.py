"""How noisy is the timing of whole builds on the simulated boards, and how many interleaved
rounds and samples does a comparison need? The numbers behind `measurement.compare` in
device_profiles/*.yaml (docs/measurement.md).

What it does, through edgetune's own library:
1. brings up its own simulated fleet: class `noise-avx512` (x86-avx512 profile, one board at
   cpu quota 1.0) and class `noise-v2` (x86-64-v2 profile, boards at quota 0.5 and 0.25);
2. tunes mlp and mobilenet-mini for both classes (`tune_fleet`, --trials per class);
3. builds each model's tuned and untuned library per class, like the artifact release;
4. on every board, for each model and each --min-repeat-ms setting: two runs of
   `measure.compare_on_board`, --rounds interleaved rounds of --repeat samples each:
   "speed-up" (untuned vs tuned) and "null" (tuned vs the same library loaded again, whose
   true ratio is 1);
5. prints, per board, model and setting: the noise within a round and between rounds, and for
   designs of R rounds x r samples (disjoint blocks of the rounds taken): the half-width of the
   bootstrap interval of untuned/tuned, how far the block estimates scatter, and how often the
   null comparison's interval excludes 1 (a false alarm at threshold 1). The raw samples go to
   WORKDIR/noise.json.

Run: .venv/bin/python bench/measurement_noise.py [--trials 96] [--rounds 12] [--repeat 3]
     [--min-repeat-ms 20,100,300] [--keep-workdir]      (~22 min on 2 cores)
Needs root (network namespaces, cgroups); holds /tmp/edgetune-bench.lock while running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _benchlib import (
    PROFILE_AVX512,
    REPO,
    BoardSpec,
    bench_main,
    load_now,
    machine_facts,
    running_fleet,
    say,
    tune_or_stop,
    write_fleet_yaml,
)

PROFILE_V2 = REPO / "device_profiles" / "x86-64-v2.yaml"
CLASSES = {"noise-avx512": PROFILE_AVX512, "noise-v2": PROFILE_V2}
BOARDS = [
    BoardSpec("noise-a", "noise-avx512", 1.0, 11),
    BoardSpec("noise-b", "noise-v2", 0.5, 21),
    BoardSpec("noise-c", "noise-v2", 0.25, 22),
]
MODELS = [
    {"name": "mlp", "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256], "dtype": "float32"}]},
    {
        "name": "mobilenet-mini",
        "builtin": "mobilenet-mini",
        "inputs": [{"name": "image", "shape": [1, 3, 64, 64], "dtype": "float32"}],
        "weight": 3,
    },
]
DESIGNS = [(1, 3), (2, 3), (3, 3), (4, 3), (6, 3), (2, 1), (4, 1), (6, 1), (12, 1)]  # (rounds, samples per round)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=96, help="tuning trials per class (default 96)")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds per setting (default 12)")
    parser.add_argument("--repeat", type=int, default=3, help="samples per library per round (default 3)")
    parser.add_argument("--min-repeat-ms", default="20,100,300", help="comma list (default 20,100,300)")
    parser.add_argument("--keep-workdir", action="store_true")
    return parser.parse_args()


def main() -> None:
    bench_main("bench-noise", parse_args(), run)


def run(args: argparse.Namespace, workdir: Path) -> None:
    from edgetune.inventory import load_fleet

    facts = machine_facts()
    tuning = {"trials_per_class": args.trials, "trials_per_iter": 8, "max_trials_per_task": 32}
    fleet = load_fleet(write_fleet_yaml(workdir, "bench-noise", CLASSES, BOARDS, MODELS, tuning))
    settings = [int(v) for v in args.min_repeat_ms.split(",")]
    with running_fleet(fleet):
        tune(fleet)
        libraries = {(c, m.name): build(fleet, c, m, workdir) for c in CLASSES for m in fleet.models}
        data = measure(fleet, libraries, settings, args, workdir / "noise.json")
    say(f"raw samples: {workdir / 'noise.json'}")
    report(data, facts, args)


def tune(fleet) -> None:
    from edgetune.tune.tuner import TuneOptions

    started = time.monotonic()
    result = tune_or_stop(fleet, TuneOptions(borrow=False))
    failed = [c.error for c in result.classes if not c.ok]
    if failed:
        raise SystemExit(f"tuning failed: {failed}")
    say(f"tuned {len(result.classes)} classes in {time.monotonic() - started:.0f} s")


def build(fleet, device_class: str, model, workdir: Path):
    """(entry, args, {"untuned": .so, "tuned": .so}) built like the artifact release does."""
    from edgetune.compiler.models import entry_function, load_model, reference_inputs
    from edgetune.compiler.prepare import (
        apply_database_and_build,
        build_untuned,
        prepare,
    )
    from edgetune.compiler.target import build_target
    from edgetune.tune.candidate_builder import SharedLibraryExport
    from edgetune.tune.database import ClassDatabasePaths, open_database

    profile = fleet.device_class(device_class).profile
    target = build_target(profile)
    mod = load_model(model)
    prepared = prepare(mod, target)
    database = open_database(ClassDatabasePaths.of(fleet.workdir, device_class))
    out = workdir / "libs" / device_class / model.name
    out.mkdir(parents=True, exist_ok=True)
    export = SharedLibraryExport(str(out), profile.cross_compiler)
    paths = {
        "untuned": Path(export(build_untuned(prepared, target))),
        "tuned": Path(export(apply_database_and_build(prepared, database, target))),
    }
    inputs = reference_inputs(model)
    return entry_function(mod), [inputs[i.name] for i in model.inputs], paths


def measure(fleet, libraries, settings: list[int], args, out: Path) -> list[dict]:
    """Per (board, model, setting): the two comparisons, each in its own
    interleaved run: "speed-up" (untuned vs tuned) and "null" (tuned vs tuned-again: two loads
    of the same library, true ratio 1). The rows so far are rewritten to `out` after each. The
    class's sessions are opened per (board, model): a session ends 600 s after it opened."""
    from edgetune.artifact.measure import compare_on_board
    from edgetune.fleet.tracker import board_sessions, rpc_endpoint
    from edgetune.inventory.schema import CompareSettings, Measurement

    rows = []
    for device_class in CLASSES:
        boards = fleet.boards_of(device_class)
        for board, model in [(b, m) for b in boards for m in fleet.models]:
            with board_sessions(rpc_endpoint(fleet, device_class), boards) as (sessions, failed):
                if failed:
                    raise SystemExit(f"boards not reachable: {failed}")
                entry, inputs, paths = libraries[(device_class, model.name)]
                comparisons = {
                    "speed-up": {"untuned": paths["untuned"], "tuned": paths["tuned"]},
                    "null": {"tuned": paths["tuned"], "tuned-again": paths["tuned"]},
                }
                for min_repeat_ms in settings:
                    measurement = Measurement(compare=CompareSettings(args.rounds, args.repeat, min_repeat_ms))
                    for comparison, labels in comparisons.items():
                        started = time.monotonic()
                        runs = compare_on_board(sessions[board.name], labels, entry, inputs, measurement)
                        elapsed = time.monotonic() - started
                        say(
                            f"{board.name} {model.name} {min_repeat_ms} ms, {comparison}: "
                            + ", ".join(f"{k} {r.timing.median_ms:.3f} ms" for k, r in runs.items())
                            + f" ({elapsed:.0f} s)"
                        )
                        rows.append(
                            {
                                "board": board.name,
                                "quota": board.simulated.cpu_quota,
                                "model": model.name,
                                "min_repeat_ms": min_repeat_ms,
                                "comparison": comparison,
                                "rounds": args.rounds,
                                "repeat": args.repeat,
                                "seconds": elapsed,
                                "samples_ms": {k: list(r.timing.samples_ms) for k, r in runs.items()},
                            }
                        )
                        out.write_text(json.dumps(rows))
    return rows


def _rounds(samples: list[float], repeat: int) -> list[list[float]]:
    return [samples[i : i + repeat] for i in range(0, len(samples), repeat)]


def _pick(rounds: list[list[float]], first: int, count: int, per_round: int) -> list[float]:
    return [s for r in rounds[first : first + count] for s in r[:per_round]]


def _blocks(row: dict, count: int, per_round: int) -> list[dict[str, list[float]]]:
    """Disjoint blocks of `count` rounds (their first `per_round` samples) of one run."""
    per = {k: _rounds(v, row["repeat"]) for k, v in row["samples_ms"].items()}
    return [
        {k: _pick(r, first, count, per_round) for k, r in per.items()}
        for first in range(0, row["rounds"] - count + 1, count)
    ]


def report(data: list[dict], facts: str, args) -> None:
    from tabulate import tabulate

    from edgetune.artifact_format.timing_stats import ratio_of_medians

    noise, designs = [], []
    keyed = {(r["board"], r["model"], r["min_repeat_ms"], r["comparison"]): r for r in data}
    for row in data:
        for label, samples in row["samples_ms"].items():
            rounds = _rounds(samples, row["repeat"])
            within = statistics.median((max(r) - min(r)) / statistics.median(r) for r in rounds)
            medians = [statistics.median(r) for r in rounds]
            between = (max(medians) - min(medians)) / statistics.median(medians)
            noise.append(
                [
                    row["board"],
                    row["quota"],
                    row["model"],
                    row["min_repeat_ms"],
                    row["comparison"],
                    label,
                    f"{statistics.median(samples):.4f}",
                    f"{within * 100:.1f}",
                    f"{between * 100:.1f}",
                    f"{row['seconds'] / 2 / row['rounds']:.2f}",
                ]
            )
    for (board, model, setting, comparison), row in keyed.items():
        if comparison != "speed-up":
            continue
        null = keyed[(board, model, setting, "null")]
        for count, per_round in DESIGNS:
            speedups = [ratio_of_medians(b["untuned"], b["tuned"]) for b in _blocks(row, count, per_round)]
            nulls = [ratio_of_medians(b["tuned-again"], b["tuned"]) for b in _blocks(null, count, per_round)]
            ratios = [e.ratio for e in speedups]
            scatter = (max(ratios) - min(ratios)) / statistics.median(ratios) if len(ratios) > 1 else 0.0
            width = statistics.median((e.high - e.low) / 2 / e.ratio for e in speedups)
            alarms = sum(not (e.low <= 1.0 <= e.high) for e in nulls)
            worst_null = max(abs(e.ratio - 1.0) for e in nulls)
            designs.append(
                [
                    board,
                    row["quota"],
                    model,
                    setting,
                    f"{count}x{per_round}",
                    len(speedups),
                    f"{statistics.median(ratios):.2f}",
                    f"{width * 100:.1f}",
                    f"{scatter * 100:.1f}",
                    f"{alarms}/{len(nulls)}",
                    f"{worst_null * 100:.1f}",
                ]
            )
    print()
    print("=" * 100)
    print(f"timing noise of whole builds on simulated boards; {facts}, {load_now()}")
    print("=" * 100)
    print(
        tabulate(
            noise,
            headers=[
                "board",
                "quota",
                "model",
                "min_repeat_ms",
                "run",
                "build",
                "median ms",
                "within-round range %",
                "between-round range %",
                "s per turn",
            ],
            disable_numparse=True,
        )
    )
    print()
    print(
        "within-round range: median over rounds of (max - min) / median of a round's samples; between-round "
        "range: (max - min) / median of the round medians; s per turn: wall time of one library's turn."
    )
    print()
    print(
        tabulate(
            designs,
            headers=[
                "board",
                "quota",
                "model",
                "min_repeat_ms",
                "rounds x samples",
                "blocks",
                "untuned/tuned",
                "CI half-width %",
                "block scatter %",
                "null alarms",
                "worst null %",
            ],
            disable_numparse=True,
        )
    )
    print()
    print(
        "Each design takes disjoint blocks of its rounds (first samples of each round) from the same runs. "
        "CI half-width: median half-width of the 95 % bootstrap interval of untuned/tuned, relative; block "
        "scatter: (max - min) / median of the blocks' untuned/tuned; null alarms: blocks of the null run "
        "(tuned vs tuned-again, two loads of one library) whose interval excludes 1; worst null: the largest "
        "|tuned-again/tuned - 1| over those blocks."
    )


if __name__ == "__main__":
    main()
