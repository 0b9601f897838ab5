"""How long the fleet dashboard takes to draw and to open at fleet scale: a synthetic fleet state
of --boards boards (written in the real formats by tests/support/synthetic_fleet.py: fleet.yaml,
deployed.json, a journal with a status, a rollout, a second status and a regress run, a tuning
summary per class), then, --runs times each, interleaved: `edgetune report` as a command (a
fresh process: imports, every chart drawn), `edgetune.report.render` in this process (what a
served page costs when a state file changed: modules imported, unchanged tuning curves kept),
and the page opened in headless Chromium (selenium; from navigation start to the load event,
and the first sort of the boards table by a click). Prints the median and the spread (min-max) of
each, the page's size, and the machine.

Run: .venv/bin/python bench/dashboard_render.py [--boards 1000] [--runs 7]
Needs Debian's chromium and chromium-driver (`make browser-packages`).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "tests")]

from _benchlib import load_now, machine_facts
from support.synthetic_fleet import write_synthetic_fleet

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(machine_facts())
    from edgetune.report import render

    with tempfile.TemporaryDirectory(prefix="edgetune-dashboard-") as directory:
        fleet = write_synthetic_fleet(Path(directory), args.boards)
        page = Path(directory) / "dashboard.html"
        page.write_bytes(render(fleet))  # the first draw imports matplotlib's fonts: not counted
        driver = _browser()
        try:
            times: dict[str, list[float]] = {"cli": [], "render": [], "load": [], "sort": []}
            for _ in range(args.runs):
                started = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "edgetune", "report", "-f", str(fleet.path), "-o", directory],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                times["cli"].append(time.perf_counter() - started)
                started = time.perf_counter()
                page.write_bytes(render(fleet))
                times["render"].append(time.perf_counter() - started)
                load, sort = _open(driver, page)
                times["load"].append(load)
                times["sort"].append(sort)
        finally:
            driver.quit()
        print(f"{args.boards} boards, page {page.stat().st_size / 1e3:.0f} kB")
    for name, values in times.items():
        print(
            f"{name:>6}: median {statistics.median(values) * 1e3:7.0f} ms  "
            f"(min {min(values) * 1e3:.0f}, max {max(values) * 1e3:.0f}; {len(values)} runs)"
        )
    print(load_now())


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def _open(driver, page: Path) -> tuple[float, float]:
    """(seconds from navigation start to the load event, seconds of one sort of the boards table)."""
    driver.get("about:blank")
    driver.get(page.as_uri())
    timing = driver.execute_script("const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd;")
    sort_ms = driver.execute_script(
        "const th = document.querySelector('#boards th:last-child'); const t0 = performance.now(); th.click();"
        "return performance.now() - t0;"
    )
    return timing / 1e3, sort_ms / 1e3


if __name__ == "__main__":
    main()
