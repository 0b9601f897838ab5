"""Question: how long does `prepare` (edgetune.compiler.prepare: the graph rewrites, legalization
and fusion every tune, plan and build runs first) take on real models, here against another
checkout of edgetune?

How: each sample is a fresh Python process (as a CLI run starts) that imports the model
(`load_model`) and then times `prepare` alone, for the bench's AVX-512 target (znver4, 1 core).
With `--against DIR` (another checkout, e.g. `git worktree add /tmp/old <rev>`), the two
checkouts take turns, ABAB, ROUNDS rounds per model; medians with the fastest and slowest
sample, and the ratio of medians. Host only, no fleet.

    .venv/bin/python bench/prepare_time.py --models ddddocr-det,yolov8n-320 [--against DIR] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import machine_facts, say  # noqa: E402
from real_models import by_name, fetch  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
# edgetune is imported before the bench's modules, which put their own checkout first on the path
SAMPLE = """
import sys, time
import tvm
import edgetune
from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import prepare
sys.path.append({bench!r})
from real_models import by_name
(model,) = by_name([{name!r}])
mod = load_model(model.spec({path!r}, layout="auto"))
target = tvm.target.Target({{"kind": "llvm", "mcpu": "znver4", "num-cores": 1}})
start = time.perf_counter()
prepare(mod, target)
print(edgetune.__file__)
print(time.perf_counter() - start)
"""


def sample(checkout: Path, name: str, path: Path) -> float:
    """Seconds of one `prepare` of the model, in a fresh process importing edgetune from `checkout`."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    code = SAMPLE.format(bench=str(HERE / "bench"), name=name, path=str(path))
    # in the checkout: `python -c` puts the working directory first on the path
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=checkout, capture_output=True, text=True, check=True)
    *_, imported, seconds = done.stdout.strip().splitlines()
    if not Path(imported).resolve().is_relative_to(checkout):
        raise SystemExit(f"the sample imported edgetune from {imported}, not from {checkout}")
    return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ddddocr-det,yolov8n-320")
    parser.add_argument("--against", type=Path, help="another checkout of edgetune, timed in turns with this one")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    say(machine_facts())
    checkouts = {"this": HERE} | ({"against": args.against.resolve()} if args.against else {})
    for model in by_name(args.models.split(",")):
        path = fetch(model)
        times: dict[str, list[float]] = {label: [] for label in checkouts}
        for index in range(args.rounds):
            for label in checkouts if index % 2 == 0 else reversed(list(checkouts)):
                times[label].append(sample(checkouts[label], model.name, path))
        medians = {label: statistics.median(values) for label, values in times.items()}
        for label, values in times.items():
            say(f"{model.name} [{label}: {checkouts[label]}]: prepare {medians[label]:.2f} s (fastest {min(values):.2f}, slowest {max(values):.2f})")
        if args.against:
            say(f"{model.name}: against / this = {medians['against'] / medians['this']:.2f}x")


if __name__ == "__main__":
    main()
