"""Question: on this machine's CPU, how fast does a model run built for one device profile
against the same model built for another, from the same tuning records? (On an AMD Zen 4:
x86-avx512, whose convolutions of 8-lane channel counts are padded to 16-lane vectors, against
x86-zen4, which leaves them as they are; edgetune.compiler.channel_padding.)

How: each real model (NHWC) prepared for each profile's target and built with one database,
the union of the records of every `--database` given (a kernel both profiles share gets the
best record of either, so only the kernels that differ differ; e.g. one
`side_by_side.py --keep-workdir` run per profile: WORKDIR/work/databases/bench-avx512).
Both builds are checked against onnxruntime on the model's reference inputs and timed on the
host, 1 thread, interleaved: ROUNDS rounds of 5 samples of >= 20 ms each, the order
alternating; the median of per-round ratios with a 95 % bootstrap interval.

    .venv/bin/python bench/profile_choice.py --database DIR [DIR ...]
        [--profiles device_profiles/x86-avx512.yaml device_profiles/x86-zen4.yaml]
        [--models ppocr-cls pplcnet-orientation] [--rounds 10]
"""

from __future__ import annotations

import os

os.environ["TVM_NUM_THREADS"] = "1"  # before tvm starts its thread pool

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import tvm.s_tir.meta_schedule as ms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from _benchlib import REPO, machine_facts, say  # noqa: E402
from single_pixel import compare_builds  # noqa: E402

from edgetune.compiler.models import entry_function, import_model  # noqa: E402
from edgetune.compiler.prepare import apply_database_and_build, extract_tasks, prepare  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.tune.database import ClassDatabasePaths, open_for_build  # noqa: E402

PROFILES = [REPO / "device_profiles" / "x86-avx512.yaml", REPO / "device_profiles" / "x86-zen4.yaml"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", type=Path, nargs="+", required=True, help="class database directories")
    parser.add_argument("--profiles", type=Path, nargs=2, default=PROFILES, help="the two device profiles")
    parser.add_argument("--models", nargs="+", default=["ppocr-cls", "pplcnet-orientation", "ppocr-det", "ppocr-rec"])
    parser.add_argument("--rounds", type=int, default=10)
    return parser.parse_args()


def merged(directories: list[Path]) -> ms.database.Database:
    """One database of every record a build of each directory applies."""
    union = ms.database.MemoryDatabase()
    for directory in directories:
        for record in open_for_build(ClassDatabasePaths(directory)).database.get_all_tuning_records():
            workload = union.commit_workload(record.workload.mod)  # a database finds records by their workload object
            union.commit_tuning_record(ms.database.TuningRecord(record.trace, workload, record.run_secs, record.target,
                                                                record.args_info))  # fmt: skip
    return union


def main() -> None:
    args = parse_args()
    profiles = [load_profile(path.resolve()) for path in args.profiles]
    targets = {profile.name: build_target(profile) for profile in profiles}
    first, second = targets
    database = merged(args.database)
    say(machine_facts())
    say(f"databases: {', '.join(map(str, args.database))}; targets: {', '.join(str(t) for t in targets.values())}")
    print(f"| model | tasks {first} / {second} | {first} ms | {second} ms | {first} / {second} [95 %] | max diff from onnxruntime (tolerance) |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        (real,) = real_models.by_name([name])
        spec = real.spec(real_models.fetch(real), "NHWC", "keep")
        mod = import_model(spec).mod
        prepared = {how: prepare(mod, target) for how, target in targets.items()}
        builds = {how: apply_database_and_build(prepared[how], database, target) for how, target in targets.items()}
        found = compare_builds(spec, entry_function(prepared[first]), builds, args.rounds)
        low, high = found.ratio["ci95"]
        tasks = [len(extract_tasks(prepared[how], target)) for how, target in targets.items()]
        print(f"| {name} | {tasks[0]} / {tasks[1]} | {found.ms[first]:.4f} | {found.ms[second]:.4f} | "
              f"**{found.ratio['median']:.3f}x [{low:.3f}-{high:.3f}]** | {found.max_diff:.2g} ({found.tolerance:.2g}) |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
