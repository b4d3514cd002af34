"""``--storage-option`` parsing and the path-or-URL arguments of the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from shardpipe.cli import main
from shardpipe.cli.storage import location, parse_storage_options, shown
from shardpipe.errors import UsageError


def test_storage_options_parse_as_json_or_text_and_nest() -> None:
    parsed = parse_storage_options(
        ("endpoint_url=http://h:9000", "anon=true", "max=3", "client_kwargs.region_name=eu", 'a.b.c={"d": 1}')
    )
    assert parsed == {
        "endpoint_url": "http://h:9000",
        "anon": True,
        "max": 3,
        "client_kwargs": {"region_name": "eu"},
        "a": {"b": {"c": {"d": 1}}},
    }
    assert parse_storage_options(("k=a=b",)) == {"k": "a=b"}
    for bad in ("novalue", "=x"):
        with pytest.raises(UsageError, match="expected KEY=VALUE"):
            parse_storage_options((bad,))
    with pytest.raises(UsageError, match="already set"):
        parse_storage_options(("a=1", "a.b=2"))


def test_locations_keep_urls_and_show_them_without_credentials() -> None:
    assert location("s3://b/p") == "s3://b/p" and location("file:///tmp/x") == Path("/tmp/x")
    assert location("rel/dir") == Path("rel/dir")
    assert shown("https://user:pw@host/p/manifest.json?sig=abc") == "https://host/p/manifest.json"


def test_a_malformed_storage_option_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(tmp_path), "--storage-option", "oops"])
    assert result.exit_code == 2 and "--storage-option 'oops': expected KEY=VALUE" in result.output
