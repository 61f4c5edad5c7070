"""Unit tests of `dataloader.config` (spec §8) and of the CLI's pipeline import: no database."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataloader.cli import import_pipelines
from dataloader.config import Scope, Settings, WorkerSpec, load_settings
from dataloader.exceptions import ConfigError

from .settings_env import clean_environment, config_error  # noqa: F401 (the fixture)

pytestmark = pytest.mark.usefixtures("clean_environment")


# --- defaults ---------------------------------------------------------------------------------


def test_defaults_match_the_spec() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.heartbeat_sec == 10
    assert settings.default_lease_ttl_sec == 60
    assert settings.reaper_period_sec == 10
    assert settings.claim_backoff_sec == 15
    assert settings.retry_base_sec == 30  # spec §6: retry after 30 * attempt seconds
    assert settings.http_host == "127.0.0.1"
    assert settings.http_port == 8000
    assert settings.workers == [WorkerSpec(queue="default", concurrency=4)]
    assert settings.total_slots == 4
    assert settings.db_dsn is None
    assert settings.asyncpg_dsn is None
    assert settings.pipeline_modules == []


# --- WORKERS_JSON -----------------------------------------------------------------------------


def test_workers_json_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "WORKERS_JSON",
        '[{"queue":"load.cbr","concurrency":2},{"queue":"load.sgx","concurrency":1}]',
    )
    settings = load_settings(_env_file=None)
    assert settings.workers == [
        WorkerSpec(queue="load.cbr", concurrency=2),
        WorkerSpec(queue="load.sgx", concurrency=1),
    ]
    assert settings.total_slots == 3


def test_workers_json_takes_slots_shared_by_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "WORKERS_JSON",
        '[{"queues": ["emails", "sms"], "concurrency": 4, "batch_size": {"emails": 10}},'
        ' {"queue": "etl", "concurrency": 2}]',
    )
    shared, own = load_settings(_env_file=None).workers
    assert (shared.served, shared.shared, shared.batch_size) == (
        ["emails", "sms"],
        True,
        {"emails": 10},
    )
    assert (own.served, own.shared) == (["etl"], False)


@pytest.mark.parametrize(
    ("value", "mentions"),
    [
        pytest.param('[{"queue": "a", "concurrency": 1}', "not valid JSON", id="malformed-json"),
        pytest.param('[{"queue": "a", "concurrency": 0}]', "concurrency", id="concurrency-0"),
        pytest.param('[{"concurrency": 1}]', "queue", id="missing-queue"),
        pytest.param(
            '[{"queue": "a", "concurrency": 1}, {"queue": "a", "concurrency": 2}]',
            "listed twice",
            id="duplicate-queue",
        ),
        pytest.param(
            '[{"queues": ["a", "b"], "concurrency": 1}, {"queue": "b", "concurrency": 2}]',
            "'b' is listed twice",
            id="queue-shared-and-own",
        ),
        pytest.param(
            '[{"queue": "a", "queues": ["b"], "concurrency": 1}]', '"queue"', id="both-forms"
        ),
        pytest.param('[{"queues": [], "concurrency": 1}]', "lists no queue", id="no-queues"),
        pytest.param(
            '[{"queues": ["a", "a"], "concurrency": 1}]', "a queue twice", id="queues-twice"
        ),
        pytest.param(
            '[{"queues": ["a"], "concurrency": 1, "batch_size": {"b": 2}}]',
            "not in",
            id="batch-size-of-another-queue",
        ),
        pytest.param(
            '[{"queues": ["a"], "concurrency": 1, "batch_size": {"a": 0}}]',
            "batch_size",
            id="batch-size-0",
        ),
        pytest.param(
            '[{"queues": ["a"], "concurrency": 1, "batch_size": {"a": 1001}}]',
            "batch_size",
            id="batch-size-above-1000",
        ),
        pytest.param(
            '[{"queue": "a", "concurrency": 1, "batch_size": {"a": 2}}]',
            "not in",
            id="batch-size-without-shared-slots",
        ),
        pytest.param('{"queue": "a", "concurrency": 1}', "JSON list", id="object-not-list"),
        pytest.param('"default"', "JSON list", id="string-not-list"),
        pytest.param('[{"queue": "a", "concurrency": 1, "x": 1}]', "x", id="unknown-key"),
        pytest.param(
            '[{"queue": "' + "q" * 201 + '", "concurrency": 1}]',
            "at most 200 characters",
            id="queue-longer-than-a-trigger-accepts",
        ),
    ],
)
def test_bad_workers_json_is_a_config_error_naming_it(value: str, mentions: str) -> None:
    message = config_error(WORKERS_JSON=value)
    assert message.startswith("WORKERS_JSON")
    assert mentions in message


# --- DL_DB_DSN ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://user:pw@db.example:5432/etl",
        "postgresql+asyncpg://user:pw@db.example:5432/etl",
    ],
)
def test_dsn_accepts_libpq_and_sqlalchemy_forms(monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    monkeypatch.setenv("DL_DB_DSN", dsn)
    settings = load_settings(_env_file=None)
    assert settings.db_dsn == dsn
    assert settings.asyncpg_dsn == "postgresql://user:pw@db.example:5432/etl"


def test_blank_dsn_means_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DL_DB_DSN", "  ")
    assert load_settings(_env_file=None).db_dsn is None


def test_non_postgres_dsn_is_a_config_error_naming_it() -> None:
    message = config_error(DL_DB_DSN="mysql://user:pw@db.example/etl")
    assert message.startswith("DL_DB_DSN")
    assert "postgresql://" in message


@pytest.mark.parametrize(
    ("dsn", "mentions"),
    [
        ("postgresql://user:secretpw@db.example:abc/etl", "port"),
        ("postgresql://user:secretpw@db.example:99999/etl", "port"),
    ],
    ids=["port-not-a-number", "port-out-of-range"],
)
def test_a_dsn_asyncpg_could_not_read_is_a_config_error_naming_it(dsn: str, mentions: str) -> None:
    message = config_error(DL_DB_DSN=dsn)
    assert message.startswith("DL_DB_DSN")
    assert mentions in message
    assert "secretpw" not in message


def test_a_failover_dsn_with_several_hosts_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DL_DB_DSN", "postgresql://postgres@h1:5432,h2:5432/db")
    settings = load_settings(_env_file=None)
    assert settings.asyncpg_dsn == (
        "postgresql://postgres@h1:5432,h2:5432/db?target_session_attrs=read-write"
    )


def test_a_keyword_value_dsn_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DL_DB_DSN", "host=h1,h2 port=5432 dbname=db target_session_attrs=primary")
    settings = load_settings(_env_file=None)
    assert settings.asyncpg_dsn == (
        "postgresql:///db?host=h1,h2&port=5432&target_session_attrs=primary"
    )


def test_a_read_dsn_may_ask_for_a_standby(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = "postgresql://h1,h2/db?target_session_attrs=prefer-standby"
    monkeypatch.setenv("DL_DB_READ_DSN", dsn)
    assert load_settings(_env_file=None).db_read_dsn == dsn


def test_a_dsn_asking_for_a_standby_is_a_config_error_naming_it() -> None:
    message = config_error(DL_DB_DSN="postgresql://h1,h2/db?target_session_attrs=standby")
    assert message.startswith("DL_DB_DSN")
    assert "asks for a standby" in message


# --- other variables --------------------------------------------------------------------------


def test_pipeline_modules_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DL_PIPELINE_MODULES", "a, b,,c")
    assert load_settings(_env_file=None).pipeline_modules == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DL_HEARTBEAT_SEC", "0"),
        ("DL_HEARTBEAT_SEC", "soon"),
        ("DL_DEFAULT_LEASE_TTL_SEC", "0"),
        ("DL_REAPER_PERIOD_SEC", "-1"),
        ("DL_HTTP_PORT", "70000"),
        ("DL_LOG_LEVEL", "LOUD"),
    ],
)
def test_bad_value_is_a_config_error_naming_the_variable(variable: str, value: str) -> None:
    assert config_error(**{variable: value}).startswith(f"{variable}: ")


def test_env_file_in_the_working_directory_is_honoured(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "DL_HEARTBEAT_SEC=3\n"
        'WORKERS_JSON=[{"queue":"from.file","concurrency":2}]\n'
        "DL_DB_DSN=postgresql://u@h/db\n",
        encoding="utf-8",
    )
    settings = load_settings()  # cwd is tmp_path (autouse fixture)
    assert settings.heartbeat_sec == 3
    assert settings.workers == [WorkerSpec(queue="from.file", concurrency=2)]
    assert settings.db_dsn == "postgresql://u@h/db"


def test_environment_wins_over_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("DL_HEARTBEAT_SEC=3\n", encoding="utf-8")
    monkeypatch.setenv("DL_HEARTBEAT_SEC", "7")
    assert load_settings().heartbeat_sec == 7


# --- API tokens and the listening address -----------------------------------------------------

SECRET = "s3cret-token-value-0123456789"


def test_api_tokens_are_read_with_scopes_and_hidden_in_reprs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "DL_API_TOKENS",
        f'[{{"name": "etl", "scope": "trigger", "token": "{SECRET}"}},'
        f' {{"name": "ops", "scope": "admin", "token": "{SECRET}-2"}}]',
    )
    settings = load_settings(_env_file=None)
    assert [(t.name, t.scope) for t in settings.api_tokens] == [
        ("etl", Scope.trigger),
        ("ops", Scope.admin),
    ]
    assert Scope.read < Scope.trigger < Scope.admin
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("tokens", "mentions"),
    [
        (f'[{{"name": "etl", "scope": "root", "token": "{SECRET}"}}]', "read, trigger, admin"),
        ('[{"name": "etl", "scope": "read", "token": "short-s3cret"}]', "16 to 4096 printable"),
        (f'[{{"name": "etl", "scope": "read", "token": "{SECRET} x"}}]', "without spaces"),
        (f'[{{"name": "etl", "scope": "read", "token": "{SECRET}é"}}]', "ASCII"),
        (f'[{{"name": "a b", "scope": "read", "token": "{SECRET}"}}]', "pattern"),
        (
            f'[{{"name": "a", "scope": "read", "token": "{SECRET}"}},'
            f' {{"name": "b", "scope": "admin", "token": "{SECRET}"}}]',
            "same token",
        ),
        (f'{{"name": "etl", "token": "{SECRET}"', "not valid JSON"),
    ],
    ids=[
        "unknown-scope",
        "short-token",
        "token-with-space",
        "token-not-ascii",
        "bad-name",
        "duplicate-token",
        "malformed",
    ],
)
def test_bad_api_tokens_are_a_config_error_that_does_not_echo_them(
    tokens: str, mentions: str
) -> None:
    message = config_error(DL_API_TOKENS=tokens)
    assert message.startswith("DL_API_TOKENS"), message
    assert mentions in message
    assert "s3cret" not in message


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "dataloader.internal"])
def test_a_non_loopback_address_needs_tokens_or_an_explicit_opt_out(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    assert "DL_API_TOKENS is empty" in config_error(DL_HTTP_HOST=host)
    monkeypatch.setenv("DL_HTTP_HOST", host)
    monkeypatch.setenv("DL_ALLOW_UNAUTHENTICATED", "true")
    assert load_settings(_env_file=None).http_host == host
    monkeypatch.delenv("DL_ALLOW_UNAUTHENTICATED")
    monkeypatch.setenv("DL_API_TOKENS", f'[{{"name": "a", "scope": "read", "token": "{SECRET}"}}]')
    assert load_settings(_env_file=None).api_tokens


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_addresses_serve_without_tokens(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("DL_HTTP_HOST", host)
    assert load_settings(_env_file=None).api_tokens == []


# --- CLI: pipeline modules ------------------------------------------------------------------


def test_missing_pipeline_module_is_a_config_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^DL_PIPELINE_MODULES: .*'no\.such\.module'"):
        import_pipelines(["no.such.module"])


def test_pipeline_module_failing_at_import_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dl_broken_pipelines.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^DL_PIPELINE_MODULES: .*dl_broken_pipelines.*boom"):
        import_pipelines(["dl_broken_pipelines"])


@pytest.mark.parametrize("value", ["inf", "nan", "1e300"])
def test_non_finite_or_huge_timings_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("DL_RETRY_BASE_SEC", value)
    with pytest.raises(ConfigError, match=r"^DL_RETRY_BASE_SEC"):
        load_settings(_env_file=None)
