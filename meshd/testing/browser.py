"""Headless Chromium for the web console's tests and benchmark, driven by Selenium through
Debian's ``chromium-driver`` (the same version as ``chromium``, from the same package source).

The browser is started so that it reaches nothing but the pages it is sent to: no sync, no
component updates, no background fetches, no QUIC, a fresh profile each time. Selenium's own
driver download (Selenium Manager) is never used: the driver's path is given.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("MESHD_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MESHD_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio",
         "--disable-dev-shm-usage")


def missing() -> str | None:
    """Why a browser test cannot run here, or None when it can."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (Path(path).exists() or shutil.which(path)):
            return f"{path} is missing (apt-get install {package}; .ci/run installs it)"
    if importlib.util.find_spec("selenium") is None:
        return "the selenium package is missing (it is in the test extra)"
    return None


def open_chromium(profile: Path, *, width: int = 1400, height: int = 860) -> Any:
    """A headless Chromium (a Selenium ``WebDriver``) with a fresh profile in ``profile``,
    recording the page's console messages (``console_errors``)."""
    from selenium import webdriver  # the test extra; a missing one is reported by missing()
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium fetch a driver
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(CHROMIUM) or CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(shutil.which(CHROMEDRIVER) or CHROMEDRIVER)
    return webdriver.Chrome(options=options, service=service)


def console_errors(driver: Any) -> list[str]:
    """The page's console messages of level error (SEVERE) since the last call: script errors,
    failed loads, CSP refusals."""
    return [str(e.get("message")) for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def bytes_at_load(driver: Any) -> dict[str, int]:
    """What the page transferred (headers and bodies, as the browser counts them: the
    performance API's ``transferSize``) for the document and every resource it fetched so far,
    by URL path; a cached answer (304) counts its few hundred bytes of headers."""
    entries = driver.execute_script(
        "return performance.getEntriesByType('navigation').concat("
        "performance.getEntriesByType('resource')).map(e => [e.name, e.transferSize]);")
    out: dict[str, int] = {}
    for name, size in entries:
        path = "/" + str(name).split("/", 3)[-1]
        out[path] = out.get(path, 0) + int(size or 0)
    return out
