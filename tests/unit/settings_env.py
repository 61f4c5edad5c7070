"""What the unit tests of settings share: an environment without the caller's settings, and
the one line a bad setting raises."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dataloader.config import load_settings
from dataloader.exceptions import ConfigError


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No DL_* / WORKERS_JSON from the caller's environment, and no `.env` in the cwd."""
    for name in list(os.environ):
        if name.upper().startswith("DL_") or name.upper() == "WORKERS_JSON":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def config_error(**env: str) -> str:
    """The ConfigError message load_settings raises with `env` set (and no .env file): one
    line."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        with pytest.raises(ConfigError) as raised:
            load_settings(_env_file=None)
    message = str(raised.value)
    assert "\n" not in message
    return message
