"""Headless Chromium driven with Selenium, for the tests that read a page as a browser shows it
(Debian's chromium and chromium-driver; the web view's and the RabbitMQ management UI's tests).

One place for the flags, so that every such test runs the same quiet browser: a fresh profile,
no network of its own (no component updates, sync or QUIC probes to the outside), no GPU and no
sandbox (tests run as root in CI)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
except ImportError:       # pragma: no cover - selenium is a test dependency
    webdriver = None  # type: ignore[assignment]

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1000")

# for a module's pytestmark
needs_chromium = [
    pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                       reason="no chromium/chromedriver (apt-get install chromium chromium-driver)"),
    pytest.mark.skipif(webdriver is None, reason="selenium is not installed"),
]


def chromium(profile: Path, console_log: bool = False):
    """A new headless Chromium with its own profile directory; `console_log`: keep the page's
    console messages for `driver.get_log("browser")`. The caller quits it."""
    assert CHROMIUM is not None and DRIVER is not None, "needs_chromium skips without them"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    if console_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
