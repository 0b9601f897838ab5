"""Device profiles for the simulated test fleets: the repository's own, with builds and
regress checks timed in shorter samples.

A real board's profile times each sample of a build's or a regress check's interleaved rounds
for at least 300 ms (`measurement.compare.min_repeat_ms`), which keeps a sample steady on a
board that throttles. A simulated board's CPU quota is enforced in 10 ms periods
(edgetune.fleet.cgroups), so 50 ms samples already span five of them; every build and check
in the suite then times for a sixth as long, in as many rounds and samples.
"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPARE_MIN_REPEAT_MS = 50


def quick_profiles(directory: Path, names: tuple[str, ...] = ("x86-64-v3", "x86-64-v2")) -> Path:
    """Write the repository's profiles `names` into `directory`, their compare samples shortened;
    return `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        profile = yaml.safe_load((REPO / "device_profiles" / f"{name}.yaml").read_text())
        profile["measurement"]["compare"]["min_repeat_ms"] = COMPARE_MIN_REPEAT_MS
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return directory
