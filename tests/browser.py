"""Headless Chromium for the report-page tests: Debian's chromium and chromium-driver (`make setup` installs
them), driven by selenium, with the flags that keep Chromium off the network (no background connections,
component updates or sync) and a fresh profile."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# The tests' screenshots of each page (a test artifact; docs/images holds the ones the docs show)
SCREENSHOTS = Path(__file__).resolve().parent / "artifacts" / "screenshots"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000")  # fmt: skip


@contextmanager
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for program in (CHROMIUM, CHROMEDRIVER):
        assert Path(program).is_file(), (
            f"{program} is missing: `make setup` installs chromium and chromium-driver"
        )
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver: Any, page: Path) -> None:
    """Load a report page from file:// and wait until its script has drawn it."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, 30).until(
        lambda d: d.find_element("css selector", "body").get_attribute("data-ready")
    )
    try:
        logged = driver.get_log("browser")
    except Exception:  # noqa: BLE001 - a driver without the log endpoint: the drawn page is the check
        logged = []
    errors = [entry for entry in logged if entry.get("level") == "SEVERE"]
    assert not errors, errors


def css(driver: Any, selector: str) -> list[Any]:
    return driver.find_elements("css selector", selector)


def screenshot(driver: Any, name: str) -> Path:
    """Save the page as it is now under tests/artifacts/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
