"""Shared fixtures (the tiny reference env and a seeded fake policy) and the skip guard.

The skip guard: a test may skip only for a reason in `ALLOWED_SKIPS` (hardware or an
extra this project cannot install everywhere). Any other skip is turned into a failure
that quotes the skip's reason and place, so a missing install step or a broken import of
the project's own code shows up red instead of as a quiet ``s``. ``TRACE_GYM_REQUIRE``
(comma-separated reasons) takes reasons off the list where the extra must be present.
"""

from __future__ import annotations

import os
import re

import pytest
from trace_gym.bench.browser import MISSING as BROWSER_MISSING

from trace_gym.realdata import MISSING
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy

pytest_plugins = ["pytester"]  # tests/test_skip_guard.py runs small suites under this conftest

#: reason -> pattern a skip message must match to be allowed (case-insensitive)
ALLOWED_SKIPS: dict[str, re.Pattern[str]] = {
    # a CUDA device is absent (or present, where a CPU-only path is tested)
    "GPU/CUDA": re.compile(r"\b(gpu|cuda)\b", re.IGNORECASE),
    # pyserini (a JVM bridge and a large stack) lives in its own venv, not `make setup`'s:
    # scripts/setup_pyserini_venv.sh; CI runs the `pyserini` tests there (.ci/run)
    "pyserini": re.compile(r"pyserini", re.IGNORECASE),
    # verl's agent-loop stack pins antlr4 4.9.3 (hydra/omegaconf), which changes math-verify's
    # verdicts, so it lives in its own venv: scripts/setup_verl_venv.sh; CI runs the `verl`
    # tests there with TRACE_GYM_REQUIRE=verl (.ci/run)
    "verl": re.compile(r"\bverl\b", re.IGNORECASE),
    # OpenEnv (the `openenv` extra) requires gradio, whose pillow<13 would downgrade the
    # stack's pillow 13.0, so `all` leaves it out; its tests skip where it is not installed
    # (docs/openenv.md says how to install it without gradio)
    "openenv": re.compile(r"\bopenenv\b", re.IGNORECASE),
    # the real data sets (trace_gym.realdata: $TRACE_GYM_DATA, default <repo>/../shared/data)
    # are not shipped; a fresh clone without them skips those tests, CI sets
    # TRACE_GYM_REQUIRE=data so they must run there
    "data": re.compile(re.escape(MISSING), re.IGNORECASE),
    # vllm runs on GPU machines only (the `vllm` extra is not part of `all`)
    "vllm": re.compile(r"vllm", re.IGNORECASE),
    # chromium + its chromedriver (trace_gym.bench.browser: $TRACE_GYM_CHROMIUM, else PATH)
    # come from apt, which the set-up runs only as root; a machine without them skips the
    # browser tests with one line saying what to install, CI sets TRACE_GYM_REQUIRE=browser
    # so they must run there
    "browser": re.compile(re.escape(BROWSER_MISSING), re.IGNORECASE),
}
#: TRACE_GYM_REQUIRE=pyserini,... takes those reasons off the allow-list: a venv built for
#: an extra (CI's pyserini venv) fails where its tests would skip
for _name in filter(None, (n.strip() for n in os.environ.get("TRACE_GYM_REQUIRE", "").split(","))):
    if _name not in ALLOWED_SKIPS:
        raise pytest.UsageError(
            f"TRACE_GYM_REQUIRE: {_name!r} is not an allowed skip reason "
            f"({', '.join(ALLOWED_SKIPS)})"
        )
    del ALLOWED_SKIPS[_name]


def allowed_skip(reason: str) -> str | None:
    """The allow-list entry that permits a skip with this message, or None."""
    for name, pattern in ALLOWED_SKIPS.items():
        if pattern.search(reason):
            return name
    return None


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> tuple[str, str]:
    """(where, message) of a skipped report; pytest stores (path, lineno, message)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, lineno, message = longrepr
        return f"{path}:{lineno}", str(message)
    return report.nodeid, str(longrepr)


def _fail_unexpected_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    where, message = _skip_reason(report)
    if allowed_skip(message) is None:
        report.outcome = "failed"
        report.longrepr = (
            f"skip outside the allow-list of tests/conftest.py ({', '.join(ALLOWED_SKIPS)}): "
            f"{message} [{where}]\nInstall what is missing (`make setup`) or fix the import; "
            "a new legitimate reason goes into ALLOWED_SKIPS with its justification."
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_unexpected_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_unexpected_skip(outcome.get_result())


@pytest.fixture
def countdown_env():
    env = CountdownEnv()
    yield env
    env.close()


@pytest.fixture
def countdown_policy():
    return RandomCountdownPolicy()
