"""How long a small class run takes end to end, and what it pays before and after its trials.

`tune_fleet` as `edgetune tune` calls it (the class in a spawned process of its own), one class
of mlp on `--boards` loopback boards (a TVM tracker and rpc_servers on 127.0.0.1, the tuning
tests' `Loopback`), `--trials` trials from an empty database, then the same call again, which
finds nothing left to do: its time is what every class run pays besides its trials (process
start-up, task extraction, planning, reports). `--runs` times each; median (min-max).

To compare two versions of edgetune, run it from each checkout in turn (A B B A), e.g.

    PYTHONPATH=/path/to/checkout .venv/bin/python bench/class_run_time.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "tune"))  # Loopback boards and small fleets of the tuning tests

from fleets import V3, make_fleet, mlp
from loopback_boards import class_boards

import edgetune
from edgetune.tune.tuner import TuneOptions, tune_fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trials", type=int, default=16, help="trials of the class per run (rounds of 8)")
    parser.add_argument("--boards", type=int, default=1)
    args = parser.parse_args()
    tuned_s, again_s = [], []
    with (tempfile.TemporaryDirectory(prefix="edgetune-class-run-") as scratch,
          class_boards(Path(scratch), "classa", args.boards) as boards):
        for run in range(args.runs):
            workdir = Path(tempfile.mkdtemp(prefix=f"run-{run}-", dir=scratch))
            fleet = make_fleet(workdir, boards.port, {"classa": V3}, {"classa": args.boards}, (mlp(),),
                               args.trials, 8, args.trials)
            for into in (tuned_s, again_s):
                started = time.monotonic()
                result = tune_fleet(fleet, TuneOptions())
                into.append(time.monotonic() - started)
                assert result.ok, [c.error for c in result.classes]
            print(f"run {run + 1}: {tuned_s[-1]:.2f} s for {args.trials} trials, {again_s[-1]:.2f} s again", flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    print(f"\nedgetune from {Path(edgetune.__file__).parent.parent}; {cpu}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}; mlp, {args.boards} loopback board(s), {args.runs} runs")
    for label, values in (("first run", tuned_s), ("run again (nothing to do)", again_s)):
        print(f"  {label:<28} {statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
