"""What CI runs: the README's test command first, then the slow set minus a listed, reasoned few."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXCLUDED = ROOT / "tests" / "ci_slow_excluded.txt"


def excluded_slow_tests() -> list[tuple[str, str]]:
    """(node id, reason) of each slow test CI leaves out."""
    out = []
    for line in EXCLUDED.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            node, _, reason = line.partition("#")
            out.append((node.strip(), reason.strip()))
    return out


def _is_slow(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    module_slow = "pytest.mark.slow" in ast.unparse(
        [n for n in tree.body if isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n)]
        or [ast.Pass()]
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return module_slow or any("mark.slow" in ast.unparse(d) for d in node.decorator_list)
    raise AssertionError(f"{path}: no test function {name}")


def test_every_excluded_slow_test_exists_is_slow_and_has_a_reason():
    for node, reason in excluded_slow_tests():
        assert reason, f"{node}: give the reason CI leaves it out"
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        assert _is_slow(ROOT / path, re.sub(r"\[.*\]$", "", name)), f"{node} is not marked slow"


def test_ci_runs_the_readme_test_command_first_then_the_slow_set():
    steps = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("make ")]
    assert steps[0] == 'make test VENV="$VENV"'
    assert 'make lint VENV="$VENV"' in steps  # ruff check, ruff format --check, mypy
    assert [s for s in steps if s.startswith("make test-slow ")], "CI runs the slow set"
    assert "\nmake test " in (ROOT / "README.md").read_text()
    assert "ci_slow_excluded.txt" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'^test-slow:.*\n\t.*-m "slow and not gpu"', makefile, re.MULTILINE)


def test_slow_marks_are_read_from_decorators_and_pytestmark(tmp_path):
    one = tmp_path / "test_one.py"
    one.write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\ndef test_b():\n    pass\n"
    )
    two = tmp_path / "test_two.py"
    two.write_text("import pytest\n\npytestmark = [pytest.mark.slow]\n\ndef test_c():\n    pass\n")
    assert _is_slow(one, "test_a") and not _is_slow(one, "test_b") and _is_slow(two, "test_c")


def test_ci_runs_the_pyserini_tests_in_their_own_fresh_venv_where_they_cannot_skip():
    run = (ROOT / ".ci" / "run").read_text()
    assert (
        'rm -rf "$PYSERINI_VENV"' in run
        and 'scripts/setup_pyserini_venv.sh "$PYSERINI_VENV"' in run
    )
    step = next(ln for ln in run.splitlines() if "-m pyserini" in ln)
    assert "TRACE_GYM_REQUIRE=pyserini" in step and '"$PYSERINI_VENV/bin/python" -m pytest' in step
    marked = [
        p
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.name != "test_ci.py" and "pytest.mark.pyserini" in p.read_text()
    ]
    assert marked, "no test is marked pyserini"
    # the step runs tests/hotpotqa only (the rest of the suite needs the main venv's extras)
    assert all(p.parent.name == "hotpotqa" for p in marked), marked


def test_no_installed_package_shadows_the_project_tests_package():
    """A top-level `tests` in site-packages (verl's wheel ships one) wins over this checkout's
    tests/ in any process that does not put the checkout first on sys.path: Ray workers
    then fail to unpickle test helpers ("No module named 'tests.distributed'")."""
    import subprocess
    import sys

    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util as u; s = u.find_spec('tests'); print(s and s.origin)",
        ],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found in ("None", ""), f"an installed package provides a top-level `tests`: {found}"


def test_ci_runs_the_verl_tests_in_their_own_fresh_venv_where_they_cannot_skip():
    run = (ROOT / ".ci" / "run").read_text()
    assert 'rm -rf "$VERL_VENV"' in run and 'scripts/setup_verl_venv.sh "$VERL_VENV"' in run
    step = next(ln for ln in run.splitlines() if "-m verl" in ln)
    assert "TRACE_GYM_REQUIRE=verl" in step and '"$VERL_VENV/bin/python" -m pytest' in step
    # verl stays out of `all`: its antlr4 4.9.3 would change math-verify's verdicts in the main venv
    text = (ROOT / "pyproject.toml").read_text()
    all_line = next(ln for ln in text.splitlines() if ln.startswith("all = "))
    assert "verl" not in all_line


def test_ci_runs_the_openenv_tests_in_their_own_fresh_venv_where_they_cannot_skip():
    run = (ROOT / ".ci" / "run").read_text()
    assert 'rm -rf "$OPENENV_VENV"' in run
    assert 'scripts/setup_openenv_venv.sh "$OPENENV_VENV"' in run
    step = next(ln for ln in run.splitlines() if "-m openenv" in ln)
    assert "TRACE_GYM_REQUIRE=openenv" in step and '"$OPENENV_VENV/bin/python" -m pytest' in step
    # openenv stays out of `all`: its gradio pins pillow<13, below the stack's pillow 13
    text = (ROOT / "pyproject.toml").read_text()
    all_line = next(ln for ln in text.splitlines() if ln.startswith("all = "))
    assert "openenv" not in all_line


def test_make_lint_runs_ruff_format_and_mypy_on_the_configured_modules():
    makefile = (ROOT / "Makefile").read_text()
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    for command in ("-m ruff check .", "-m ruff format --check .", "-m mypy"):
        assert command in lint, command
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = config["tool"]["mypy"]["files"]
    assert all((ROOT / f).exists() for f in files), files
    for core in (
        "trace_gym/core.py",
        "trace_gym/runner.py",
        "trace_gym/alloc",
        "trace_gym/predict",
    ):
        assert core in files
    dev = config["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("mypy==") for d in dev), "mypy is pinned in the dev extra"


def test_every_install_of_the_set_up_is_a_step_that_says_its_time():
    """`make demo` spent minutes in a silent `pip -q`: each install runs through `step`, which
    prints a line when it starts and one with its time when it ends, and pip is not quiet
    unless SETUP_QUIET=1 asks for it."""
    lines = [
        ln.split("#", 1)[0] for ln in (ROOT / "scripts" / "setup_venv.sh").read_text().splitlines()
    ]
    stepped = {m for ln in lines for m in re.findall(r'^\s*step "[^"]*" (\w+)', ln)}
    current = None  # the shell function whose body we are in
    installs = 0
    for n, ln in enumerate(lines, 1):
        head = re.match(r"^(\w+)\(\) \{", ln)
        current = head.group(1) if head else current
        if "pip install" in ln:
            installs += 1
            assert re.match(r'^\s*step "', ln) or current in stepped, (n, ln)
            assert " -q " not in ln, (n, ln)
        if current and (ln.rstrip() == "}" or (head and ln.rstrip().endswith("}"))):
            current = None
    assert installs >= 5 and {"install_torch", "install_verl"} <= stepped
    assert any("done in $((SECONDS - t0)) s" in ln for ln in lines)


def test_ci_requires_the_real_data_and_the_browser_tests():
    """Both are declared skip categories (tests/conftest.py); in CI neither may skip."""
    run = (ROOT / ".ci" / "run").read_text()
    assert "\nexport TRACE_GYM_REQUIRE=data,browser\n" in run
