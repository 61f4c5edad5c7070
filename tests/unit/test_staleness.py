"""How stale a standby's reads may be (`core.staleness`), and the settings that name it
(`DL_DB_READ_DSN`, `DL_DB_READ_MAX_LAG_SEC`). The standby itself: test_replica_reads.py."""

from __future__ import annotations

import pytest

from dataloader.config import load_settings
from dataloader.core.staleness import (
    Freshness,
    LagTracker,
    current_freshness,
    note_read,
    observing_reads,
)
from dataloader.exceptions import ConfigError

from .settings_env import clean_environment  # noqa: F401 (the fixture, used by pytestmark)

pytestmark = pytest.mark.usefixtures("clean_environment")


def test_a_standby_that_replayed_all_the_primary_had_is_not_behind() -> None:
    tracker = LagTracker()
    assert tracker.observe(1000, 10.0, 1000, 0.2, 10.01) == 0.0
    # an idle primary: its last commit ages, the standby is no less caught up
    assert tracker.observe(1000, 50.0, 1000, 40.0, 50.01) == 0.0


def test_a_standby_behind_lags_by_the_time_since_the_primary_was_where_it_is_now() -> None:
    tracker = LagTracker()
    assert tracker.observe(1000, 10.0, 1000, 0.1, 10.0) == 0.0  # caught up at t=10
    assert tracker.observe(1500, 11.0, 1200, 3600.0, 11.0) == pytest.approx(1.0)
    assert tracker.observe(1800, 12.0, 1200, 3600.0, 12.5) == pytest.approx(2.5)
    # it caught up with the sample of t=11: behind by at most what came after it
    assert tracker.observe(1900, 13.0, 1600, 3600.0, 13.0) == pytest.approx(2.0)


def test_the_age_of_the_last_replayed_commit_bounds_the_lag_too() -> None:
    tracker = LagTracker()
    assert tracker.observe(1000, 10.0, 1000, 0.0, 10.0) == 0.0
    assert tracker.observe(2000, 20.0, 1500, 0.3, 20.0) == pytest.approx(0.3)


def test_a_lag_nothing_bounds_is_unknown() -> None:
    """Behind, with no sample at or below its position and no commit replayed: unknown (the
    reads go to the primary)."""
    assert LagTracker().observe(2000, 20.0, 1500, None, 20.0) is None


def test_a_server_that_is_no_standby_is_not_behind() -> None:
    """A DL_DB_READ_DSN naming a primary is allowed: nothing to replay, nothing stale."""
    assert LagTracker().observe(2000, 20.0, None, None, 20.0) == 0.0


def test_samples_are_bounded() -> None:
    tracker = LagTracker(kept=3)
    for n in range(10):
        tracker.observe(1000 + n, float(n), 1000 + n, 0.0, float(n))
    assert tracker.observe(5000, 10.0, 1003, None, 10.0) is None  # its sample is forgotten
    assert tracker.observe(5000, 11.0, 1009, None, 11.0) == pytest.approx(2.0)


def test_freshness_says_where_and_how_stale() -> None:
    assert Freshness("replica", 0.4123).header() == "replica; lag=0.412s"
    assert Freshness("primary", fallback="lagging").header() == "primary; fallback=lagging"
    assert Freshness("primary").header() == "primary"
    assert "0.4 s behind the primary" in Freshness("replica", 0.4123).sentence()
    assert "cannot be reached" in Freshness("primary", fallback="unavailable").sentence()


def test_an_answer_reports_its_stalest_read() -> None:
    assert current_freshness() is None
    note_read(Freshness("replica", 9.0))  # nobody observes: nothing kept
    with observing_reads() as seen:
        assert current_freshness() is None
        note_read(Freshness("primary", fallback="error"))
        assert current_freshness() == Freshness("primary", fallback="error")
        note_read(Freshness("replica", 0.2))
        note_read(Freshness("replica", 0.7))
        note_read(Freshness("replica", 0.1))
        assert seen.freshness == Freshness("replica", 0.7)
    assert current_freshness() is None


# --- settings -----------------------------------------------------------------------------------


def test_the_read_dsn_is_unset_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(_env_file=None)
    assert settings.db_read_dsn is None
    assert settings.db_read_max_lag_sec == 5
    monkeypatch.setenv("DL_DB_READ_DSN", " ")
    assert load_settings(_env_file=None).db_read_dsn is None


@pytest.mark.parametrize(
    "dsn",
    ["postgresql://reader:pw@standby.example:5432/etl", "postgresql+asyncpg://standby/etl"],
)
def test_the_read_dsn_takes_the_forms_of_the_queues_dsn(
    monkeypatch: pytest.MonkeyPatch, dsn: str
) -> None:
    monkeypatch.setenv("DL_DB_READ_DSN", dsn)
    assert load_settings(_env_file=None).db_read_dsn == dsn


@pytest.mark.parametrize(
    ("variable", "value", "mentions"),
    [
        ("DL_DB_READ_DSN", "mysql://reader:secretpw@standby/etl", "postgresql://"),
        ("DL_DB_READ_DSN", "postgresql://reader:secretpw@standby:99999/etl", "port"),
        ("DL_DB_READ_MAX_LAG_SEC", "0", "greater than 0"),
        ("DL_DB_READ_MAX_LAG_SEC", "soon", "number"),
    ],
)
def test_a_bad_read_setting_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, mentions: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as raised:
        load_settings(_env_file=None)
    message = str(raised.value)
    assert message.startswith(variable)
    assert mentions in message
    assert "secretpw" not in message
    assert "\n" not in message
