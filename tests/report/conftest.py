"""Fixtures of the dashboard tests: a headless Chromium driven by selenium (Debian's `chromium`
and `chromium-driver`; `make test` installs them), and the real server (`create_app` with a
dashboard, on uvicorn, HTTPS) in a thread."""

from __future__ import annotations

import os
import shutil

import pytest
from support.artifact_server import RunningServer
from support.fleet_marker import starts_fleet

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium that keeps its console log (`driver.get_log("browser")`)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI has no browser for the dashboard tests: missing {', '.join(missing)}")
        pytest.skip(f"no browser: missing {', '.join(missing)} (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--ignore-certificate-errors",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
@starts_fleet
def served_synthetic(tmp_path):
    """A 20-board synthetic fleet with a deploy section, its operator token, a board token,
    and the real server with the dashboard: (fleet, server)."""
    from support.loopback import free_port
    from support.synthetic_fleet import write_synthetic_fleet

    from edgetune.artifact_format.signing import init_keys
    from edgetune.deploy.operator import ensure_operator_token
    from edgetune.deploy.tokens import ensure_token
    from edgetune.report import DashboardCache

    fleet = write_synthetic_fleet(tmp_path, 20, deploy_port=free_port())
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    ensure_operator_token(fleet)
    ensure_token(fleet, fleet.boards[0])
    server = RunningServer(fleet, DashboardCache(fleet))
    try:
        yield fleet, server
    finally:
        server.stop()
