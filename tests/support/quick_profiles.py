"""Device profiles for the simulated test fleets: the repository's own, with builds and
regress checks timed in fewer, shorter samples.

A real board's profile times each sample of a build's or a regress check's interleaved rounds
for at least 300 ms (`measurement.compare.min_repeat_ms`), which keeps a sample steady on a
board that throttles. A simulated board's CPU quota is enforced in 10 ms periods
(edgetune.fleet.cgroups), so 50 ms samples already span five of them; and two samples a build
per round instead of three still give each comparison eight, in as many interleaved rounds.
Every build and check in the suite then times for a ninth as long.
"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPARE_MIN_REPEAT_MS = 50
COMPARE_REPEAT = 2


def quick_profiles(directory: Path, names: tuple[str, ...] = ("x86-64-v3", "x86-64-v2")) -> Path:
    """Write the repository's profiles `names` into `directory`, their compare samples fewer and
    shorter; return `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        profile = yaml.safe_load((REPO / "device_profiles" / f"{name}.yaml").read_text())
        profile["measurement"]["compare"].update(min_repeat_ms=COMPARE_MIN_REPEAT_MS, repeat=COMPARE_REPEAT)
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return directory
