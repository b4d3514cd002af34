"""``shardpipe``'s public names: the docstring lists ``__all__``, the functions are the CLI's verbs, and the
old names of renamed functions warn and give the new objects."""

from __future__ import annotations

import re
import warnings

import pytest

import shardpipe
from shardpipe.cli import main


def test_the_docstring_lists_exactly_the_public_names() -> None:
    listed = re.findall(r"^\s*from shardpipe import (.+)$", shardpipe.__doc__ or "", flags=re.MULTILINE)
    names = [name.strip() for line in listed for name in line.split(",")]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(shardpipe.__all__)
    assert dir(shardpipe) == shardpipe.__all__


def test_every_public_name_loads_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in shardpipe.__all__:
            assert getattr(shardpipe, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'summarise'"):
        shardpipe.summarise  # noqa: B018


def test_every_command_of_the_cli_is_a_library_function_of_its_name() -> None:
    for verb in main.commands:
        assert verb in shardpipe.__all__, verb
        assert callable(getattr(shardpipe, verb)), verb


@pytest.mark.parametrize(("old", "new"), [("summarize", "inspect"), ("index_folder", "index")])
def test_an_old_name_warns_naming_the_new_one_and_gives_its_object(old: str, new: str) -> None:
    assert old not in shardpipe.__all__
    for _ in range(2):  # every use warns, not only the first
        with pytest.warns(DeprecationWarning, match=rf"^shardpipe\.{old} is deprecated.*shardpipe\.{new}$"):
            given = getattr(shardpipe, old)
        assert given is getattr(shardpipe, new)
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=rf"use shardpipe\.{new}$"):
        exec(f"from shardpipe import {old}", namespace)  # as a caller's import line does
    assert namespace[old] is getattr(shardpipe, new)
