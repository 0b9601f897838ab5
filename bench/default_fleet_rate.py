"""Trials per minute of `edgetune tune` on the default fleet's shape, from one or more checkouts
of edgetune taking turns on the same simulated boards.

What it does:
1. reads the repository's fleet.yaml and brings up the same classes (profiles), boards (per
   class, with their CPU quotas), models and tuning policy (budget, rounds, borrowing) as the
   bench's own simulated fleet (network etune-bench, see bench/README.md);
2. `--turns` times, each checkout in turn (A B B A ...): removes the tuning databases and
   reports, then runs `python -m edgetune tune -f FLEET --json` with PYTHONPATH set to the
   checkout, as a user runs it (the classes in processes of their own, the borrower after its
   donor);
3. prints per checkout the median trials per minute (every class's trials over the command's
   wall time, start-up and reports included) with min-max, and each class's own rate.

Run: .venv/bin/python bench/default_fleet_rate.py [--checkouts PATH[,PATH]] [--turns 2]
(a checkout of another commit: `git worktree add --detach /tmp/before <commit>`; the boards run
this checkout's rpc_server.)
Needs root (network namespaces, cgroups); holds /tmp/edgetune-bench.lock while running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from _benchlib import REPO, BoardSpec, bench_main, load_now, machine_facts, running_fleet, say, write_fleet_yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkouts", default=str(REPO), help="comma-separated checkouts of edgetune")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args()
    bench_main("default-fleet-rate", args, run)


def run(args: argparse.Namespace, workdir: Path) -> None:
    from edgetune.inventory import load_fleet

    checkouts = [Path(c).resolve() for c in args.checkouts.split(",")]
    for checkout in checkouts:
        if not (checkout / "edgetune" / "__init__.py").exists():
            raise SystemExit(f"--checkouts: {checkout} is not a checkout of edgetune (no edgetune/__init__.py)")
    facts = machine_facts()
    path = _default_fleet_shape(workdir)
    fleet = load_fleet(path)
    order = [checkouts if turn % 2 == 0 else checkouts[::-1] for turn in range(args.turns)]
    rates: dict[Path, list[float]] = {c: [] for c in checkouts}
    class_rates: dict[tuple[Path, str], list[float]] = {}
    with running_fleet(fleet):
        for turn in order:
            for checkout in turn:
                trials, seconds, per_class = _one_run(path, fleet.workdir, checkout)
                rates[checkout].append(trials / seconds * 60)
                for name, rate in per_class.items():
                    class_rates.setdefault((checkout, name), []).append(rate)
                say(f"{_describe(checkout)}: {trials} trials in {seconds:.0f} s: {rates[checkout][-1]:.1f} trials/min")
    print()
    print(f"machine: {facts}; {load_now()}")
    print(f"fleet: the shape of {REPO / 'fleet.yaml'}: " + ", ".join(
        f"{c.name} ({len(fleet.boards_of(c.name))} boards)" for c in fleet.device_classes))
    print(f"{'checkout':<50} {'trials/min median':>18} {'min-max':>14} {'runs':>5}   per class (trials/min, median)")
    for checkout, values in rates.items():
        per_class = ", ".join(f"{name} {statistics.median(v):.1f}" for (c, name), v in class_rates.items() if c == checkout)
        print(f"{_describe(checkout):<50} {statistics.median(values):>18.1f} "
              f"{f'{min(values):.1f}-{max(values):.1f}':>14} {len(values):>5}   {per_class}")
    if len(checkouts) == 2:
        ratio = statistics.median(rates[checkouts[1]]) / statistics.median(rates[checkouts[0]])
        print(f"{_describe(checkouts[1])} / {_describe(checkouts[0])}: {ratio:.2f}x trials per minute (medians)")


def _default_fleet_shape(workdir: Path) -> Path:
    """A fleet.yaml in `workdir` with the repository fleet's classes, boards, models and tuning
    on the bench's network."""
    default = yaml.safe_load((REPO / "fleet.yaml").read_text())
    classes = {c["name"]: (REPO / c["profile"]).resolve() for c in default["device_classes"]}
    boards = [BoardSpec(b["name"], b["device_class"], b["simulated"]["cpu_quota"], 11 + n)
              for n, b in enumerate(default["boards"])]
    return write_fleet_yaml(workdir, "bench-default-fleet", classes, boards, default["models"], default["tuning"])


def _one_run(fleet_yaml: Path, state: Path, checkout: Path) -> tuple[int, float, dict[str, float]]:
    """`edgetune tune` from `checkout` on fresh databases: (trials, wall seconds, trials/min per class)."""
    for kept in ("databases", "reports"):
        shutil.rmtree(state / kept, ignore_errors=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "edgetune", "tune", "-f", str(fleet_yaml), "--json"],
                          env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout,  # -m puts the cwd first
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"edgetune tune from {checkout} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    classes = json.loads(done.stdout)["classes"]
    per_class = {c["device_class"]: c["trials_run"] / c["tuning_time_s"] * 60 for c in classes}
    return sum(c["trials_run"] for c in classes), seconds, per_class


def _describe(checkout: Path) -> str:
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return f"{checkout.name}@{commit}{'+changes' if dirty else ''}"


if __name__ == "__main__":
    main()
