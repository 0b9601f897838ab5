"""The dashboard of the simulated test fleet after tune and build (`released_fleet`), a rollout
through the real server (the same as tests/regress's: where that ran first, every board is
`unchanged`), and a regress run of one board slowed by a simulated firmware update (undone
after), as tests/regress does: opened in a real browser.

With EDGETUNE_SCREENSHOT=path set, the test saves a screenshot of the page there (the README's
docs/dashboard.png is made so)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from support.artifact_server import RunningServer
from support.browser_checks import broken_images, console_errors

MODEL = "mlp"
SLOWED = "fast-1"
SLOWED_QUOTA = 0.2  # of a core, down from 1: slower beyond the threshold even on a busy host


@pytest.fixture(scope="module")
def checked_fleet(released_fleet, tmp_path_factory):
    """(fleet, page, server, regress verdicts by board): mlp rolled out to every board, the fleet's
    status taken, fast-1 regress-checked with its CPU quota cut to a fifth, the page written."""
    from edgetune.deploy.rollout import plan_rollout, rollout
    from edgetune.fleet import cgroups, fleet_status
    from edgetune.fleet.sim import plan_sim, sim_firmware, sim_firmware_file
    from edgetune.regress.check import regress
    from edgetune.report import DashboardCache, report

    fleet = released_fleet
    server = RunningServer(fleet, DashboardCache(fleet))
    try:
        result = rollout(fleet, plan_rollout(fleet, MODEL, canary=0))
        assert result.ok, result.records()
        sim = next(s for s in plan_sim(fleet) if s.board.name == SLOWED)
        sim_firmware(fleet, SLOWED, "2.2-slow-governor", cpu_quota=SLOWED_QUOTA)
        try:
            report_ = regress(fleet, boards=[SLOWED], models=[MODEL])  # one board timed: ~25 s each
            fleet_status(fleet)
        finally:
            sim_firmware_file(fleet, sim.board).unlink(missing_ok=True)
            cgroups.limit_quota(sim.cgroup, sim.board.simulated.cpu_quota)
        verdicts = {v.board: v for v in report_.verdicts}
        assert verdicts[SLOWED].verdict == "slower", [
            (v.board, v.verdict, v.ratio, v.interval) for v in report_.verdicts
        ]
        yield fleet, report(fleet, tmp_path_factory.mktemp("dashboard")), server, verdicts
    finally:
        server.stop()


def test_the_page_shows_the_fleet_as_its_files_say(checked_fleet, browser):
    from edgetune.fleet.state import load_deployed

    fleet, page, _, verdicts = checked_fleet
    browser.get_log("browser")
    browser.get(page.as_uri())
    deployed = load_deployed(fleet)
    for board in fleet.boards:
        row = browser.find_element(By.CSS_SELECTOR, f'#boards tr[data-board="{board.name}"]')
        assert (
            row.find_element(By.CSS_SELECTOR, f'td.running[data-model="{MODEL}"]').text
            == f"v{deployed[board.name][MODEL]}"
        )
    cell = browser.find_element(By.CSS_SELECTOR, f'#boards tr[data-board="{SLOWED}"] td.verdict')
    verdict = verdicts[SLOWED]
    assert cell.text == f"slower {verdict.ratio:.2f}x [{verdict.interval[0]:.2f}, {verdict.interval[1]:.2f}]"
    assert "verdict-slower" in cell.get_attribute("class")  # in red
    images = browser.find_elements(By.CSS_SELECTOR, "img.curve")
    assert len(images) == len(fleet.device_classes) and not broken_images(browser)
    assert not console_errors(browser)
    versions = browser.find_element(By.ID, "versions").text
    assert all(f"{MODEL} {c.name} v" in versions for c in fleet.device_classes)
    history = browser.find_element(By.ID, "history").text  # from the journal the verbs appended to
    assert f"rollout of {MODEL}" in history and f"slower: {SLOWED}" in history
    assert f"{SLOWED}: firmware changed since its baseline" in history
    screenshot = os.environ.get("EDGETUNE_SCREENSHOT")
    if screenshot:
        browser.set_window_size(1400, 1900)
        browser.save_screenshot(str(Path(screenshot).resolve()))


def test_the_server_serves_the_same_page_to_the_operator_only(checked_fleet):
    import urllib.error
    import urllib.request

    from edgetune.deploy.operator import ensure_operator_token
    from edgetune.deploy.tokens import read_token

    fleet, _, server, _ = checked_fleet
    token_path, _ = ensure_operator_token(fleet)

    def status(token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(server.url + "/dashboard", headers=headers)
        try:
            with urllib.request.urlopen(request, context=server.context, timeout=60) as answer:
                assert b"slower" in answer.read()
                return answer.status
        except urllib.error.HTTPError as err:
            err.close()
            return err.code

    assert status(None) == 401
    assert status(read_token(fleet, fleet.board(SLOWED))) == 403
    assert status(token_path.read_text()) == 200
