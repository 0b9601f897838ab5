"""`edgetune report` on synthetic fleet states written in the real formats: a 1000-board fleet
loaded in a real browser, missing and damaged files, the tuning curve from the first trial, and
`/dashboard` on the real server refusing all but the operator token."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
from selenium.webdriver.common.by import By
from support.browser_checks import broken_images, console_errors
from support.synthetic_fleet import slowed, write_synthetic_fleet

from edgetune.cli import main
from edgetune.report import DashboardCache, render, report

BOARDS = 1000


def test_a_1000_board_fleet_renders_and_loads_in_the_browser(tmp_path, browser):
    fleet = write_synthetic_fleet(tmp_path, BOARDS)
    page = report(fleet, tmp_path / "out")
    browser.get_log("browser")  # start from an empty console log
    browser.get(page.as_uri())
    assert browser.execute_script("return document.querySelectorAll('#boards tbody tr').length") == BOARDS
    slower = {
        r.get_attribute("data-board")
        for r in browser.find_elements(By.CSS_SELECTOR, "#boards tr:has(td.verdict-slower)")
    }
    assert slower == {b.name for b in fleet.boards if slowed(b.name)} and slower
    assert browser.find_elements(By.CSS_SELECTOR, "img.curve") and not broken_images(browser)
    assert not console_errors(browser)
    # the filter keeps the slower boards; sorting by the verdict column puts the slowest first
    browser.find_element(By.ID, "board-filter").send_keys("slower")
    visible = browser.execute_script(
        "return Array.from(document.querySelectorAll('#boards tbody tr')).filter((r) => !r.hidden).map((r) => r.dataset.board);"
    )
    assert set(visible) == slower
    header = browser.find_element(By.XPATH, "//table[@id='boards']//th[text()='mlp: last regress']")
    header.click()
    header.click()  # descending
    first = browser.find_element(By.CSS_SELECTOR, "#boards tbody tr")
    assert first.get_attribute("data-board") in slower


def test_missing_pieces_are_shown_as_missing(tmp_path):
    fleet = write_synthetic_fleet(tmp_path, 4)
    for name in ("state", "reports"):
        for path in sorted((tmp_path / "work" / name).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    html = render(fleet).decode()
    assert "no <code>fleet status</code> recorded yet" in html and "no regress run yet" in html
    assert "no artifact version built yet" in html and "no tuning report yet" in html
    assert "no rollout, regress run or fleet status recorded yet" in html and "id=problems" not in html


def test_damaged_files_are_named_in_the_page(tmp_path):
    fleet = write_synthetic_fleet(tmp_path, 4)
    deployed = tmp_path / "work" / "state" / "deployed.json"
    deployed.write_text('{"schema": "edgetune.deployed", "schema_version": 1, "boards": {"b0000": {"mlp": [1]}}}')
    journal = tmp_path / "work" / "state" / "journal.jsonl"
    with open(journal, "a") as f:
        f.write('{"schema": "edgetune.journal-event", "schema_ver')  # torn by a crash
    summary = tmp_path / "work" / "reports" / "gw-fast" / "mlp" / "summary.json"
    summary.write_text("{not json")
    html = render(fleet).decode()
    problems = html[html.index("id=problems") : html.index("</div>", html.index("id=problems"))]
    assert str(deployed) in problems and f"{journal}: line 5" in problems and str(summary) in problems
    assert html.count("slower") >= 1  # what could be read is still shown


def test_the_cli_writes_the_page(tmp_path, capsys):
    fleet = write_synthetic_fleet(tmp_path, 4)
    assert main(["report", "-f", str(fleet.path), "-o", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "dashboard.html")
    assert b"Fleet synthetic" in (tmp_path / "out" / "dashboard.html").read_bytes()


def test_the_cli_draws_the_selected_boards_only(tmp_path, capsys):
    fleet = write_synthetic_fleet(tmp_path, 4)
    chosen = fleet.boards[1].name
    assert main(["report", "-f", str(fleet.path), "-o", str(tmp_path / "out"), "--select", f"board={chosen}"]) == 0
    html = (tmp_path / "out" / "dashboard.html").read_text()
    assert f'data-board="{chosen}"' in html
    assert not any(f'data-board="{b.name}"' in html for b in fleet.boards if b.name != chosen)


def test_the_served_page_is_drawn_again_when_an_input_changes(tmp_path):
    from edgetune.fleet.journal import record_event

    fleet = write_synthetic_fleet(tmp_path, 4)
    cache = DashboardCache(fleet)
    first = cache()
    assert cache() is first  # nothing changed: not drawn again
    record_event(fleet, "rollout", model="mlp", stopped="a canary failed", outcomes=[])
    assert b"stopped: a canary failed" in cache()


def _get(server, token: str | None, basic: bool = False) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(server.url + "/dashboard")
    if token and basic:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"operator:{token}".encode()).decode())
    elif token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=server.context, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_dashboard_opens_for_the_operator_token_only(served_synthetic):
    from edgetune.deploy.operator import operator_token_path
    from edgetune.deploy.tokens import read_token

    fleet, server = served_synthetic
    operator = operator_token_path(fleet).read_text()
    assert operator_token_path(fleet).stat().st_mode & 0o777 == 0o600
    status, headers, body = _get(server, None)
    assert status == 401 and "Basic" in headers["www-authenticate"] and b"<html" not in body
    status, _, body = _get(server, read_token(fleet, fleet.boards[0]))
    assert status == 403 and json.loads(body) == {"error": "a board token does not open the dashboard"}
    assert _get(server, "x" * 43)[0] == 401
    for basic in (False, True):
        status, headers, body = _get(server, operator, basic)
        assert status == 200 and headers["content-type"].startswith("text/html") and b"Fleet synthetic" in body
        assert "default-src 'none'" in headers["content-security-policy"]


def test_the_board_api_refuses_the_operator_token(served_synthetic):
    from edgetune.deploy.operator import operator_token_path

    fleet, server = served_synthetic
    request = urllib.request.Request(
        f"{server.url}/v1/boards/{fleet.boards[0].name}/models/mlp",
        headers={"Authorization": f"Bearer {operator_token_path(fleet).read_text()}"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=server.context, timeout=30)
    assert refused.value.code == 401
    refused.value.close()


def test_a_browser_opens_the_served_dashboard_with_the_token_as_password(served_synthetic, browser):
    from edgetune.deploy.operator import operator_token_path

    fleet, server = served_synthetic
    token = operator_token_path(fleet).read_text()
    browser.get_log("browser")
    browser.get(server.url.replace("https://", f"https://operator:{token}@") + "/dashboard")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Fleet synthetic"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#boards tbody tr")) == 20
    assert not broken_images(browser) and not console_errors(browser)
