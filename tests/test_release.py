"""The release: version string, CHANGELOG, public-API list; wheel + sdist (slow)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import trace_gym

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_comes_from_package_metadata():
    assert trace_gym.__version__ == metadata.version("trace-gym") == VERSION


def test_changelog_has_an_entry_for_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)


def test_api_doc_lists_every_public_name_and_the_deprecation_rule():
    text = (ROOT / "docs/api.md").read_text()
    top = text.split("## `import trace_gym`")[1].split("\n## ")[0]
    listed = set(re.findall(r"^- `trace_gym\.([A-Za-z_]+)`", top, re.M))
    assert set(trace_gym.__all__) - {"__version__"} <= listed
    for name in listed:  # nothing listed that does not exist
        assert hasattr(trace_gym, name), name
    assert "## Deprecation rule" in text


def _build(out: Path) -> tuple[Path, Path]:
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


@pytest.mark.slow
def test_wheel_and_sdist_install_in_a_clean_venv_and_run_the_demo(tmp_path):
    wheel, sdist = _build(tmp_path / "dist")
    assert (
        wheel.name == f"trace_gym-{VERSION}-py3-none-any.whl"
        and sdist.name == f"trace_gym-{VERSION}.tar.gz"
    )
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "trace_gym/py.typed",
        "trace_gym/wrap.py",
        "trace_gym/corpora/",
        "trace_gym/bench/view_assets/",
    ):
        assert any(n.startswith(needed) for n in names), needed
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=900)
    out = subprocess.run(
        [str(env_dir / "bin" / "trace-gym"), "demo"],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    ).stdout
    assert "=== trace/HotpotQA-v0 ===" in out and "##### allocation" in out
    got = subprocess.run(
        [str(py), "-c", "import trace_gym; print(trace_gym.__version__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert got == VERSION
    # the sdist builds the same wheel contents
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(sdist)],
        check=True,
        timeout=900,
    )
