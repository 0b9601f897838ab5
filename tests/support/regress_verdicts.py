"""What a test whose subject is not the timing verdict checks of a regress verdict: the board was
timed against its baseline (ok, slower or faster, with the ratio inside its interval), whichever
way a machine shared with other test workers tipped it."""

from __future__ import annotations

from edgetune.artifact_format.timing_stats import FASTER, SLOWER
from edgetune.regress.check import OK

TIMED = (OK, SLOWER, FASTER)


def assert_timed(verdict) -> None:
    assert verdict.verdict in TIMED, verdict.to_json()
    ratio, interval = verdict.ratio, verdict.interval
    assert ratio is not None and interval is not None and interval[0] <= ratio <= interval[1], verdict.to_json()
