"""Headless chromium through selenium, for the viewer's browser test and `bench view`.

The browser and its driver are found where they are, never downloaded (selenium's own
driver manager is not used):

- the browser: ``$TRACE_GYM_CHROMIUM`` (a path, or a name on PATH) when it is set, else
  the first of ``chromium``, ``chromium-browser``, ``google-chrome`` on PATH (Debian's
  ``chromium`` is ``/usr/bin/chromium``);
- the driver: ``$TRACE_GYM_CHROMEDRIVER`` (a path, or a name on PATH) when it is set,
  else ``chromedriver`` on PATH, else a ``chromedriver`` in the browser's own folder.

Browser tests are a declared category like the real-data ones: where either is missing
they skip with `MISSING` 's one line (what to install), the ``browser`` entry of the
skip allow-list, and they cannot skip where ``TRACE_GYM_REQUIRE=browser`` is set, as
in CI. Both the test and the README screenshot go through `open_page`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from trace_gym.cli import Parser
from trace_gym.errors import TraceGymError

__all__ = ["INSTALL", "MISSING", "Browser", "BrowserMissing", "Page", "find_browser", "open_page"]

#: the setting naming the browser binary, and the one naming its driver
BROWSER_VAR, DRIVER_VAR = "TRACE_GYM_CHROMIUM", "TRACE_GYM_CHROMEDRIVER"
#: browser names looked for on PATH, in order
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
#: every message for an absent browser, driver or selenium starts so (the allow-list matches it)
MISSING = "browser missing"
INSTALL = (
    "apt-get install -y chromium chromium-driver (as root; `make setup` does it) and "
    "pip install -e '.[dev]' (selenium), or point TRACE_GYM_CHROMIUM (and "
    "TRACE_GYM_CHROMEDRIVER) at an installed chromium and its chromedriver"
)


class BrowserMissing(TraceGymError, RuntimeError):
    """chromium, its chromedriver or selenium is not found (the message says what to install)."""


@dataclass
class Page:
    """An open page: the driver, and how long the first prompt took to show."""

    driver: Any
    #: seconds from navigation until the page's script marked the first prompt drawn
    load_s: float
    #: the page's own clock when its script finished the first prompt (ms since navigation)
    ready_ms: float
    console: list[dict[str, Any]] = field(default_factory=list)

    def console_errors(self) -> list[str]:
        """SEVERE console entries since the page opened (errors, uncaught exceptions)."""
        self.console += self.driver.get_log("browser")
        return [e["message"] for e in self.console if e.get("level") == "SEVERE"]

    def click_branch_point(self) -> int:
        """Click the deepest mixed anchor of the shown tree (else node 1); returns its id."""
        from selenium.webdriver.common.by import By

        nodes = self.driver.find_elements(By.CSS_SELECTOR, "#tree .node")
        mixed = [n for n in nodes if n.find_elements(By.CSS_SELECTOR, "circle.mixed")]
        node = (mixed[1:] or mixed or nodes[1:] or nodes)[-1]
        node.find_element(By.CSS_SELECTOR, "circle.dot").click()
        return int(node.get_attribute("data-id"))

    def screenshot(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return path


class Browser(NamedTuple):
    """Where the browser binary and its chromedriver were found."""

    #: the chromium (or chrome) executable
    binary: str
    #: the chromedriver executable that drives it
    driver: str


def _which(name: str) -> str | None:
    """An executable named by path or found on PATH."""
    return shutil.which(os.path.expanduser(name))


def _missing(what: str) -> BrowserMissing:
    return BrowserMissing(f"{MISSING}: {what}; install: {INSTALL}")


def _locate(var: str, names: tuple[str, ...], absent: str) -> str:
    """``$var`` when it is set (it must be an executable), else the first of `names` found."""
    named = os.environ.get(var, "").strip()
    found = _which(named) if named else next(filter(None, map(_which, names)), None)
    if found is None:
        raise _missing(f"{var}={named} is not an executable" if named else absent)
    return found


def find_browser() -> Browser:
    """The browser and driver (module docstring: settings first, then PATH); `BrowserMissing`."""
    binary = _locate(BROWSER_VAR, BROWSER_NAMES, f"none of {', '.join(BROWSER_NAMES)} is on PATH")
    beside = str(Path(binary).resolve().parent / "chromedriver")
    driver = _locate(
        DRIVER_VAR, ("chromedriver", beside), f"no chromedriver on PATH nor beside {binary}"
    )
    return Browser(binary, driver)


def _driver(width: int, height: int) -> Any:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise _missing("selenium is not installed") from e
    found = find_browser()
    opts = webdriver.ChromeOptions()
    opts.binary_location = found.binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=found.driver), options=opts)


@contextmanager
def open_page(
    path: str | Path,
    *,
    width: int = 1400,
    height: int = 1000,
    timeout: float = 30.0,
    viewer: bool = True,
    fragment: str = "",
) -> Iterator[Page]:
    """Open a local page and wait until the viewer has drawn its first prompt (or, with
    ``viewer=False``, until any page has loaded)."""
    driver = _driver(width, height)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        t0 = time.perf_counter()
        driver.get(Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else ""))
        WebDriverWait(driver, timeout).until(
            lambda d: (
                d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
                if viewer
                else d.execute_script("return document.readyState") == "complete"
            )
        )
        load_s = time.perf_counter() - t0
        ready = driver.execute_script("return window.traceViewerReadyMs || null")
        yield Page(driver, load_s, float(ready) if ready is not None else float("nan"))
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    """``python -m trace_gym.bench.browser PAGE.html OUT.png``: a screenshot of any local page."""
    import sys

    p = Parser(prog="python -m trace_gym.bench.browser", description=main.__doc__)
    p.add_argument("page", type=Path)
    p.add_argument("png", type=Path)
    p.add_argument("--height", type=int, default=1000)
    args = p.parse_args(argv)
    try:
        with open_page(args.page, viewer=False, height=args.height) as page:
            print(f"wrote {page.screenshot(args.png)}")
    except BrowserMissing as e:
        print(f"python -m trace_gym.bench.browser: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
