"""Where the viewer's headless browser is found: settings first, then PATH (no fixed path)."""

from __future__ import annotations

import pytest
from trace_gym.bench.browser import MISSING, BrowserMissing, find_browser


def _exe(folder, name):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def bare(monkeypatch, tmp_path):
    """A PATH with nothing on it and neither setting."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("TRACE_GYM_CHROMIUM", raising=False)
    monkeypatch.delenv("TRACE_GYM_CHROMEDRIVER", raising=False)
    return monkeypatch


def test_the_browser_and_driver_are_found_on_path(bare, tmp_path):
    bin_ = tmp_path / "bin"
    driver = _exe(bin_, "chromedriver")
    browser = _exe(bin_, "chromium-browser")
    bare.setenv("PATH", str(bin_))
    assert find_browser() == (browser, driver)
    chromium = _exe(bin_, "chromium")  # Debian's name comes first
    assert find_browser().binary == chromium


def test_the_settings_name_the_browser_and_its_driver(bare, tmp_path):
    browser = _exe(tmp_path / "opt" / "chrome", "chrome")
    beside = _exe(tmp_path / "opt" / "chrome", "chromedriver")
    bare.setenv("TRACE_GYM_CHROMIUM", browser)
    assert find_browser() == (browser, beside)  # the driver beside the named browser
    driver = _exe(tmp_path / "drivers", "my-driver")
    bare.setenv("TRACE_GYM_CHROMEDRIVER", driver)
    assert find_browser() == (browser, driver)


@pytest.mark.parametrize(
    "setting, says",
    [
        ({}, "none of chromium, chromium-browser, google-chrome is on PATH"),
        ({"TRACE_GYM_CHROMIUM": "/no/such/chrome"}, "TRACE_GYM_CHROMIUM=/no/such/chrome"),
        ({"PATH_BROWSER": "1"}, "no chromedriver on PATH nor beside"),
    ],
)
def test_a_missing_browser_is_one_line_that_says_what_to_install(bare, tmp_path, setting, says):
    if setting.pop("PATH_BROWSER", None):
        bare.setenv("PATH", str(tmp_path / "bin"))
        _exe(tmp_path / "bin", "chromium")
    for k, v in setting.items():
        bare.setenv(k, v)
    with pytest.raises(BrowserMissing) as e:
        find_browser()
    text = str(e.value)
    assert text.startswith(MISSING + ": ") and says in text and "\n" not in text
    assert "apt-get install -y chromium chromium-driver" in text and "TRACE_GYM_CHROMIUM" in text
