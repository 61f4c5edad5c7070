"""DSNs as users write them: URLs with one or several hosts, libpq's keyword/value form, and
what is refused before any connection is tried."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from dataloader.core.dsn import DsnError, normalise_dsn


def _query(dsn: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(dsn).query)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://user:pw@db.example:5432/etl",
        "postgresql+asyncpg://user:pw@db.example:5432/etl",
        "postgres://db.example/etl?sslmode=require",
        "postgresql:///etl?host=/var/run/postgresql",
        "postgresql://[::1]:5433/etl",
    ],
)
def test_a_one_host_url_is_kept_as_written(dsn: str) -> None:
    assert normalise_dsn(dsn) == dsn


def test_several_hosts_reach_the_primary_unless_the_dsn_says_otherwise() -> None:
    dsn = normalise_dsn("postgresql://u@h1:5432,h2:5433/db")
    assert dsn.startswith("postgresql://u@h1:5432,h2:5433/db?")
    assert _query(dsn)["target_session_attrs"] == ["read-write"]


@pytest.mark.parametrize("attrs", ["primary", "read-write", "any"])
def test_several_hosts_keep_a_writable_target_session_attrs(attrs: str) -> None:
    dsn = f"postgresql://u@h1,h2/db?target_session_attrs={attrs}"
    assert normalise_dsn(dsn) == dsn


def test_hosts_in_the_query_count_as_several() -> None:
    dsn = normalise_dsn("postgresql:///db?host=h1,h2&port=5432,5433")
    assert _query(dsn)["target_session_attrs"] == ["read-write"]
    assert _query(dsn)["host"] == ["h1,h2"]


@pytest.mark.parametrize("attrs", ["standby", "prefer-standby", "read-only"])
def test_a_dsn_asking_for_a_standby_is_refused_for_writes(attrs: str) -> None:
    with pytest.raises(DsnError, match=f"target_session_attrs={attrs} asks for a standby"):
        normalise_dsn(f"postgresql://h1,h2/db?target_session_attrs={attrs}")
    dsn = f"postgresql://h1,h2/db?target_session_attrs={attrs}"
    assert normalise_dsn(dsn, writes=False) == dsn


def test_an_unknown_target_session_attrs_is_refused() -> None:
    with pytest.raises(DsnError, match="'master' is not one of"):
        normalise_dsn("postgresql://h/db?target_session_attrs=master")


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u@h:99999/db",
        "postgresql://u@h1:5432,h2:port/db",
        "postgresql://u@/db?host=h1,h2&port=5432,x",
        "host=h1,h2 port=5432,70000 dbname=db",
    ],
)
def test_every_port_must_be_a_number(dsn: str) -> None:
    with pytest.raises(DsnError, match="the port must be a number from 0 to 65535"):
        normalise_dsn(dsn)


def test_the_keyword_value_form_becomes_a_url() -> None:
    dsn = normalise_dsn(
        "host=h1,h2 port=5432,5433 dbname=etl user=loader password='p w\\'x'"
        " target_session_attrs=primary sslmode=require"
    )
    parts = urlsplit(dsn)
    assert parts.scheme == "postgresql"
    assert parts.username == "loader"
    assert parts.password == "p%20w%27x"  # the quoted value, escapes undone, percent-encoded
    assert parts.path == "/etl"
    assert _query(dsn) == {
        "host": ["h1,h2"],
        "port": ["5432,5433"],
        "target_session_attrs": ["primary"],
        "sslmode": ["require"],
    }


def test_the_keyword_value_form_with_several_hosts_reaches_the_primary() -> None:
    dsn = normalise_dsn("host=h1,h2 dbname=etl")
    assert dsn == "postgresql:///etl?host=h1,h2&target_session_attrs=read-write"


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("mysql://h/db", "must be a URL"),
        ("db.example", "must be a URL"),
        ("host=h1 dbname", "cannot read it from character 8"),
        ("password=se cret dbname=d", "cannot read it from character 12"),
    ],
)
def test_what_is_no_dsn_is_refused_in_one_line(dsn: str, says: str) -> None:
    with pytest.raises(DsnError, match=says) as raised:
        normalise_dsn(dsn)
    assert "cret" not in str(raised.value)
