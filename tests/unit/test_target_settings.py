"""DL_TARGET_DSN, the database of the tasks' engine: read and checked like DL_DB_DSN."""

from __future__ import annotations

import pytest

from dataloader.config import load_settings
from dataloader.exceptions import ConfigError

from .settings_env import clean_environment  # noqa: F401 (the fixture, used by pytestmark)

pytestmark = pytest.mark.usefixtures("clean_environment")


@pytest.mark.parametrize(
    "dsn",
    ["postgresql://u:pw@dwh.example/dwh", "postgresql+asyncpg://u:pw@dwh.example/dwh"],
)
def test_dl_target_dsn_is_read_in_either_form(monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    monkeypatch.setenv("DL_TARGET_DSN", dsn)
    settings = load_settings(_env_file=None)
    assert settings.target_dsn == dsn
    assert settings.db_dsn is None  # the queue's database is another setting


def test_a_blank_dl_target_dsn_means_the_queues_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DL_TARGET_DSN", "  ")
    assert load_settings(_env_file=None).target_dsn is None


@pytest.mark.parametrize(
    ("dsn", "mentions"),
    [
        ("mysql://u:secretpw@db.example/etl", "postgresql://"),
        ("postgresql://u:secretpw@db.example:port/etl", "port"),
    ],
    ids=["scheme", "port"],
)
def test_a_malformed_dl_target_dsn_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, dsn: str, mentions: str
) -> None:
    monkeypatch.setenv("DL_TARGET_DSN", dsn)
    with pytest.raises(ConfigError) as raised:
        load_settings(_env_file=None)
    message = str(raised.value)
    assert message.startswith("DL_TARGET_DSN")
    assert mentions in message
    assert "secretpw" not in message
