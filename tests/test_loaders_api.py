"""The loaders' public API: every name of ``loaders.__all__`` resolves, and every name it no longer
exports still imports from ``loaders`` for one release, warning, as the same object as its new home's."""

from __future__ import annotations

import importlib

import pytest

import loaders


def test_every_public_name_resolves_without_a_warning() -> None:
    for name in loaders.__all__:
        value = getattr(loaders, name)  # a warning would be an error here
        assert value.__name__ == name and value.__module__.startswith("loaders."), (name, value)


def test_the_public_homes_export_their_names() -> None:
    for home in sorted(set(loaders.DEPRECATED.values())):
        module = importlib.import_module(home)
        for name in module.__all__:
            assert hasattr(module, name), f"{home}.{name}"


@pytest.mark.parametrize("name", sorted(loaders.DEPRECATED))
def test_a_deprecated_name_warns_with_its_new_home_and_is_the_same_object(name: str) -> None:
    home = loaders.DEPRECATED[name]
    assert name not in loaders.__all__
    assert name in importlib.import_module(home).__all__
    with pytest.warns(
        DeprecationWarning, match=rf"loaders\.{name} .* import it from {home} \({home}\.{name}\)"
    ):
        old = getattr(loaders, name)
    assert old is getattr(importlib.import_module(home), name)


def test_the_warning_points_at_the_line_that_imports() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        from loaders import plan_epoch  # noqa: F401
    assert {warning.filename for warning in caught} == {__file__}


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'plan_epochs'"):
        loaders.plan_epochs  # noqa: B018
