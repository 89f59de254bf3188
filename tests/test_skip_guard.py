"""The conftest skip guard: a skip outside the allow-list fails the run, an allowed one does not."""

from __future__ import annotations

from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")


def test_unexpected_skip_fails_allowed_skip_and_xfail_pass(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        """
        import pytest

        def test_missing_install():
            pytest.importorskip("no_such_module_xyz")

        def test_no_gpu():
            pytest.skip("needs a CUDA device")

        @pytest.mark.skipif(True, reason="vllm is not installed")
        def test_no_vllm():
            pass

        @pytest.mark.xfail(reason="known", strict=True)
        def test_known_failure():
            assert False
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=0, failed=1, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines(["*skip outside the allow-list*no_such_module_xyz*"])
    assert result.ret != 0


def test_module_level_skip_of_own_code_fails_collection(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        """
        import pytest

        pytest.importorskip("trace_gym.not_built_yet")

        def test_never_runs():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*skip outside the allow-list*trace_gym.not_built_yet*"])
    assert result.ret != 0


def test_required_extra_turns_its_skip_into_a_failure(pytester, monkeypatch):
    monkeypatch.delenv("TRACE_GYM_REQUIRE", raising=False)  # CI sets it for the outer run
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        """
        import pytest

        def test_no_pyserini():
            pytest.skip("pyserini is not installed")

        def test_no_gpu():
            pytest.skip("needs a CUDA device")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
    monkeypatch.setenv("TRACE_GYM_REQUIRE", "pyserini")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*skip outside the allow-list*pyserini is not installed*"])


def test_absent_real_data_skips_and_is_required_where_asked(pytester, monkeypatch):
    monkeypatch.delenv("TRACE_GYM_REQUIRE", raising=False)  # .ci/run sets it to "data,browser"
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        """
        import pytest

        from trace_gym.realdata import missing, path_of

        def test_needs_math():
            if not path_of("math").is_dir():
                pytest.skip(missing("math"))
        """
    )
    monkeypatch.setenv("TRACE_GYM_DATA", str(pytester.path / "no_data_here"))
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*real data set missing: math*TRACE_GYM_DATA*"])
    monkeypatch.setenv("TRACE_GYM_REQUIRE", "data")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)


def test_the_data_root_follows_the_environment(monkeypatch, tmp_path):
    from trace_gym.realdata import SETS, data_root, missing, path_of

    monkeypatch.setenv("TRACE_GYM_DATA", str(tmp_path))
    assert data_root() == tmp_path and path_of("math") == tmp_path / "math"
    for name in SETS:
        assert str(path_of(name)) in missing(name) and "TRACE_GYM_DATA" in missing(name)
    monkeypatch.delenv("TRACE_GYM_DATA")
    assert data_root().parts[-2:] == ("shared", "data")
