"""What a page in the headless browser shows that a user would see as broken: errors in its
console, images that did not load."""

from __future__ import annotations


def console_errors(browser) -> list[dict]:
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def broken_images(browser) -> list[str]:
    return browser.execute_script(
        "return Array.from(document.images).filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.alt);"
    )
