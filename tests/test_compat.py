"""The deprecated import paths of moved modules and names: they warn and still resolve."""

from __future__ import annotations

import importlib

import pytest

from trace_gym.compat import DEPRECATED_ALIASES, MOVED_NAMES, moved


@pytest.mark.parametrize("old", sorted(DEPRECATED_ALIASES))
def test_every_alias_stub_forwards_to_its_new_module_with_a_warning(old):
    new = importlib.import_module(DEPRECATED_ALIASES[old])
    name = next(n for n in getattr(new, "__all__", dir(new)) if not n.startswith("_"))
    stub = importlib.reload(importlib.import_module(old))
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new.__name__}"):
        assert getattr(stub, name) is getattr(new, name)


@pytest.mark.parametrize("package", sorted(MOVED_NAMES))
def test_moved_names_forward_only_the_names_that_moved(package):
    new, names = MOVED_NAMES[package]
    pkg = importlib.import_module(package)
    for name in names:
        with pytest.warns(DeprecationWarning, match=f"{package}.{name} moved to {new}"):
            assert getattr(pkg, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        pkg.no_such_name  # noqa: B018


def test_an_alias_must_be_listed():
    with pytest.raises(ValueError, match="DEPRECATED_ALIASES"):
        moved("trace_gym.nowhere", "trace_gym.elsewhere")
