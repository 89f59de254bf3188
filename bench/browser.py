"""Headless chromium through selenium, for the viewer's browser test and `bench view`.

Uses Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromedriver``) so that
selenium never tries to download a driver. Both the test and the README screenshot go
through `open_page`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser
from trace_gym.errors import TraceGymError

__all__ = ["INSTALL", "BrowserMissing", "Page", "open_page"]

CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = "apt-get install -y chromium chromium-driver (as root; `make setup` does it) and pip install -e '.[dev]' (selenium)"


class BrowserMissing(TraceGymError, RuntimeError):
    """chromium, chromium-driver or selenium is not installed (the message says how to)."""


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


def _driver(width: int, height: int) -> Any:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise BrowserMissing(f"selenium is not installed: {INSTALL}") from e
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None or not Path(CHROMEDRIVER).exists():
        raise BrowserMissing(f"chromium or {CHROMEDRIVER} is missing: {INSTALL}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


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
        print(f"browser: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
