"""How a second timing settles a `slower` verdict (the timings themselves: test_regress_fleet.py)."""

from __future__ import annotations

import pytest

from edgetune.regress.check import LOAD_FAILED, Verdict, _confirm


def timed(verdict: str, ratio: float | None) -> Verdict:
    return Verdict("fast-1", "gw-fast", "mlp", 3, verdict, ratio, (ratio, ratio) if ratio else None, 1.0, 1.0, False)


def test_slower_twice_is_slower_with_the_second_timings_figures():
    verdict = _confirm(timed("slower", 1.9), timed("slower", 2.1))
    assert (verdict.verdict, verdict.ratio) == ("slower", 2.1)
    assert verdict.detail == "confirmed: a first timing said 1.90x"


@pytest.mark.parametrize("second", ["ok", "faster"])
def test_slower_once_is_what_the_second_timing_says(second):
    verdict = _confirm(timed("slower", 1.4), timed(second, 1.02))
    assert (verdict.verdict, verdict.ratio) == (second, 1.02)
    assert verdict.detail == "a first timing said slower 1.40x, a second did not"


def test_a_second_run_that_fails_is_the_verdict():
    failed = timed(LOAD_FAILED, None)
    assert _confirm(timed("slower", 1.4), failed) is failed
