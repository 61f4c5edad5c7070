"""Settings: the only module that reads the environment (and `.env`).

Every variable of the spec (§8) keeps its name; ours start with `DL_` too. A bad value raises
`ConfigError` whose message names the variable, so the service can stop with one clear line.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, Self
from urllib.parse import urlsplit

from dotenv import dotenv_values
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from dataloader.core import clusters as routing
from dataloader.core.cron import check_schedule, check_timezone
from dataloader.core.dsn import normalise_dsn
from dataloader.core.limits import BATCH_SIZE_MAX, check_args, check_key, check_name
from dataloader.core.retry import MAX_DELAY_SEC
from dataloader.exceptions import ConfigError

#: Bound of DL_PROCESS_WAIT_MAX_SEC, and the longest wait a request of the processes' routes
#: may ask for (it waits no longer than the setting).
PROCESS_WAIT_BOUND_SEC = 3600.0

QueueName = Annotated[str, AfterValidator(check_name)]  # a queue that can be triggered


class WorkerSpec(BaseModel):
    """One entry of `WORKERS_JSON`: serve `queue` with `concurrency` slots of its own, or
    share `concurrency` slots among `queues`, round-robin, each slot taking up to
    `batch_size[queue]` jobs of a queue per cycle (1 for a queue not named there)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: QueueName | None = None
    queues: list[QueueName] | None = None
    concurrency: Annotated[int, Field(ge=1, le=10_000)]
    batch_size: dict[QueueName, Annotated[int, Field(ge=1, le=BATCH_SIZE_MAX)]] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        if (self.queue is None) == (self.queues is None):
            raise ValueError('give "queue" (slots of its own) or "queues" (shared slots)')
        if self.queues is not None:
            if not self.queues:
                raise ValueError('"queues" lists no queue')
            if len(set(self.queues)) < len(self.queues):
                raise ValueError('"queues" lists a queue twice')
        unknown = set(self.batch_size) - set(self.queues or ())
        if unknown:
            raise ValueError(f'"batch_size" names a queue not in "queues": {sorted(unknown)[0]!r}')
        return self

    @property
    def served(self) -> list[str]:
        """The queues this entry serves."""
        return self.queues if self.queues is not None else [str(self.queue)]

    @property
    def shared(self) -> bool:
        """Whether its slots are shared by several queues (`queues`)."""
        return self.queues is not None


class CronSpec(BaseModel):
    """One entry of `DL_CRON`: enqueue `task` on `queue` at each slot of `schedule` (a cron
    expression read in `timezone`), once per slot across every replica. A slot missed while
    no process led (all down) is skipped, or with `catch_up` enqueued late (the latest 100)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: QueueName
    schedule: Annotated[str, AfterValidator(check_schedule)]
    task: QueueName
    queue: QueueName
    args: dict[str, Any] = Field(default_factory=dict)
    #: Jobs of one schedule share a lock_key by default: a slow run delays the next, never
    #: overlaps it.
    lock_key: Annotated[str, AfterValidator(check_key)] | None = None
    timezone: str = "UTC"
    catch_up: bool = False

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        check_timezone(value)
        return value

    @field_validator("args")
    @classmethod
    def _args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_args(value)


class Scope(IntEnum):
    """What an API token may do; each scope includes the ones below it."""

    read = 1  # job status, /status
    trigger = 2  # trigger and cancel jobs
    admin = 3  # everything


_TOKEN = re.compile(r"^[\x21-\x7e]{16,4096}$")


class ApiToken(BaseModel):
    """One entry of `DL_API_TOKENS`: a bearer token, its scope, and a name for the logs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:@-]{1,64}$")]
    scope: Scope
    token: SecretStr

    @field_validator("token")
    @classmethod
    def _usable(cls, value: SecretStr) -> SecretStr:
        if not _TOKEN.match(value.get_secret_value()):
            raise ValueError(
                "must be 16 to 4096 printable ASCII characters without spaces (what an HTTP"
                " header carries intact; a short token is guessable)"
            )
        return value

    @field_validator("scope", mode="before")
    @classmethod
    def _scope_by_name(cls, value: Any) -> Any:
        if isinstance(value, Scope):
            return value
        if isinstance(value, str) and value in Scope.__members__:
            return Scope[value]
        raise ValueError(f"must be one of {', '.join(Scope.__members__)}")


#: The shortest DL_SESSION_SECRET accepted.
SESSION_SECRET_MIN_CHARS = 32


def _origin(text: str) -> str:
    """An origin as browsers send it (`scheme://host[:port]`, lower case, no path), or a
    ValueError naming what is wrong with `text`."""
    parts = urlsplit(text.strip().lower())
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
        or port == -1
    ):
        raise ValueError(
            f"{text!r} is not an origin: scheme://host[:port] with nothing after it,"
            " e.g. https://ops.example.com"
        )
    return f"{parts.scheme}://{parts.netloc}"


def _json_list(value: Any, example: str) -> Any:
    """Parse a JSON list given as a string (an environment variable)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(value, list):
        raise ValueError(f"must be a JSON list like {example}")
    return value


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


class Settings(BaseSettings):
    """Service configuration. Field `x` is read from `DL_X` unless an alias says otherwise."""

    model_config = SettingsConfigDict(
        env_prefix="DL_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        allow_inf_nan=False,
        populate_by_name=True,
    )

    db_dsn: str | None = Field(
        default=None,
        description="PostgreSQL DSN, a URL or keyword=value pairs; several hosts (h1:5432,h2:5432)"
        " for a failover setup, where target_session_attrs=read-write is the default; unset"
        " starts an embedded PostgreSQL under DL_DATA_DIR.",
    )
    db_direct_dsn: str | None = Field(
        default=None,
        description="DSN straight to the server, for what needs a session of its own (the"
        " locks of lock_keys, LISTEN, migrations) when DL_DB_DSN goes through a"
        " transaction-pooling PgBouncer; the jobs' statements still go through DL_DB_DSN.",
    )
    workers: Annotated[list[WorkerSpec], NoDecode] = Field(
        default_factory=lambda: [WorkerSpec(queue="default", concurrency=4)],
        validation_alias=AliasChoices("WORKERS_JSON", "workers"),
        description='Queues served by this process, e.g. [{"queue":"load.cbr","concurrency":2}];'
        ' slots shared by queues: [{"queues":["a","b"],"concurrency":4,"batch_size":{"a":10}}].',
    )
    heartbeat_sec: float = Field(default=10, gt=0, le=86_400, description="Lease extension period.")
    default_lease_ttl_sec: int = Field(
        default=60, gt=0, le=2_147_483_647, description="Lease of jobs triggered without one."
    )
    default_max_attempts: int = Field(
        default=5, ge=1, le=1000, description="Attempts of jobs whose trigger and task name none."
    )
    max_result_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        le=100 * 1_048_576,
        description="Largest task result stored (JSON, in bytes); a larger one fails the attempt.",
    )
    target_dsn: str | None = Field(
        default=None,
        description="Database of the engine and sessions tasks get (ctx.engine); unset: the"
        " queue's own.",
    )
    db_read_dsn: str | None = Field(
        default=None,
        description="A streaming standby (or any server showing the queue's database) for"
        " the reads that may be a little stale: lists of jobs and processes, queue statistics,"
        " charts, /status's counts; never a job's own state, claims or what a change reads"
        " first. Unreachable or behind by more than DL_DB_READ_MAX_LAG_SEC: the primary.",
    )
    db_read_max_lag_sec: float = Field(
        default=5,
        gt=0,
        le=86_400,
        description="Reads that may be stale go to the primary while DL_DB_READ_DSN is"
        " further behind than this.",
    )
    reaper_period_sec: float = Field(
        default=10, gt=0, le=86_400, description="Expired-lease sweep period."
    )
    claim_backoff_sec: float = Field(
        default=15,
        ge=0,
        le=86_400,
        description="Delay before retrying a job whose lock_key is busy.",
    )
    claim_ahead: bool = Field(
        default=True,
        description="While a queue's jobs run shorter than a claim takes, claim one set of"
        " jobs ahead of its free slots (they start as slots free; off: claim for free slots"
        " only).",
    )
    retry_base_sec: float = Field(
        default=30, ge=0, le=86_400, description="Retry delay = DL_RETRY_BASE_SEC x attempt."
    )
    http_host: str = Field(default="127.0.0.1", min_length=1)
    http_port: int = Field(default=8000, ge=0, le=65_535)
    http_reuse_port: bool = Field(
        default=False,
        description="Let several processes of this host listen on DL_HTTP_PORT together"
        " (SO_REUSEPORT: the kernel spreads new connections over them).",
    )
    pipeline_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated modules imported at start to register pipelines.",
    )
    shutdown_timeout_sec: float = Field(
        default=30, ge=0, le=86_400, description="Grace period for running jobs on SIGTERM."
    )
    auto_migrate: bool = Field(default=True, description="Apply migrations at start.")
    data_dir: Path = Field(default=Path(".dataloader"), description="Embedded PostgreSQL home.")
    log_level: str = Field(default="INFO", description="Root log level.")
    log_summary_sec: float = Field(
        default=60,
        ge=0,
        le=86_400,
        description="Period of the INFO lines that count the jobs the process ended, per"
        " queue, and the requests it answered, per route and status (each job's own lines,"
        " and each answered request's, are at DEBUG); 0: no summary.",
    )
    contract_file: Path | None = Field(
        default=None,
        description="A contract file (YAML, `dataloader contract`): a trigger of a task it"
        " declares must name the task's queue and send args that satisfy its fields (422).",
    )
    access_log: bool = Field(
        default=False,
        description="An INFO line for every request (by default only for those answered"
        " 400 and above; the others are counted in the periodic summary).",
    )
    poll_interval_sec: float = Field(
        default=5,
        gt=0,
        le=86_400,
        description="Safety poll when no notification arrives (jittered).",
    )
    db_pool_size: int = Field(
        default=20,
        ge=2,
        le=1000,
        description="Most connections of the queue pool (opened as concurrent use needs them:"
        " 32 clients triggering at once wait half as long in their p99 with 20 as with 10).",
    )
    db_timeout_sec: float = Field(
        default=10,
        gt=0,
        le=3600,
        description="Longest wait for the database's answer to one of dataloader's own"
        " statements; a connection that does not answer in time is closed and replaced (this"
        " is how a half-open connection is found).",
    )
    long_transaction_sec: float = Field(
        default=300,
        gt=0,
        le=86_400 * 365,
        description="/status warns of a transaction open longer than this: it keeps vacuum"
        " from removing the queue table's dead rows.",
    )
    presence_period_sec: float = Field(
        default=2,
        ge=0.5,  # three periods leave the time a stopped job needs to hand itself back
        le=3600,
        description="How often a process refreshes its row of live workers (dl_workers); it"
        " counts as live while refreshed within three periods. A process not refreshed for"
        " three periods is gone: its running jobs are taken back then (it stops them itself"
        " before, when it cannot refresh).",
    )
    task_threads: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="Threads a process runs plain `def` task handlers in: at most this many"
        " run at once; another waits for a thread, its job running (leased) meanwhile.",
    )
    loop_held_warn_sec: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="A handler that holds the workers' event loop this long or longer (a"
        " blocking call in an `async def` handler) is named in a WARNING and in /status. The"
        " process stays alive meanwhile: a thread of its own keeps its presence and leases.",
    )
    cron: Annotated[list[CronSpec], NoDecode] = Field(
        default_factory=list,
        description='Periodic tasks, e.g. [{"name":"nightly","schedule":"0 3 * * *",'
        '"task":"etl.nightly","queue":"etl"}] (also `@task(cron=…)`); enqueued once per slot'
        " by the process that leads maintenance.",
    )
    leader_lease_sec: float = Field(
        default=15,
        ge=1,
        le=3600,
        description="Lease of the process that runs maintenance (reaper, pruner, cron); it"
        " renews it every third of this, and another takes over this long after it died.",
    )
    prune_period_sec: float = Field(
        default=60, gt=0, le=86_400, description="How often finished jobs are pruned."
    )
    prune_batch_size: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Rows deleted per statement (each a short transaction of its own).",
    )
    prune_succeeded_after_sec: float = Field(
        default=7 * 86_400,
        ge=0,
        le=MAX_DELAY_SEC,
        description="Succeeded jobs (and their journals) are deleted this long after they"
        " ended; 0: kept forever.",
    )
    prune_canceled_after_sec: float = Field(
        default=7 * 86_400, ge=0, le=MAX_DELAY_SEC, description="The same for canceled jobs."
    )
    prune_failed_after_sec: float = Field(
        default=30 * 86_400, ge=0, le=MAX_DELAY_SEC, description="The same for failed jobs."
    )
    prune_lost_after_sec: float = Field(
        default=30 * 86_400, ge=0, le=MAX_DELAY_SEC, description="The same for lost jobs."
    )
    prune_removed_processes_after_sec: float = Field(
        default=7 * 86_400,
        ge=0,
        le=MAX_DELAY_SEC,
        description="Removed durable processes (their row and history) are deleted this long"
        " after their removal; 0: kept forever.",
    )
    prune_heartbeats_after_sec: float = Field(
        default=86_400,
        ge=0,
        le=MAX_DELAY_SEC,
        description="Heartbeat entries of the journal are deleted after this, whatever their"
        " job's state (a long job writes many); 0: kept with their job.",
    )
    process_wait_max_sec: float = Field(
        default=60.0,
        gt=0,
        le=PROCESS_WAIT_BOUND_SEC,
        description="Longest an HTTP request waits for a durable process's response (start,"
        " call, repair, remove, a task's response); a request may ask for up to"
        f" {PROCESS_WAIT_BOUND_SEC:g} s, waits the smaller of that and this, then gets 504"
        " with the task's id (keep it below your proxies' idle timeout).",
    )
    allow_unknown_tasks: bool = Field(
        default=False,
        description="Accept jobs, schedules and stages of a task no live process knows on a"
        " queue live processes serve (a rolling deploy whose new tasks are not running yet);"
        " by default they are refused (422), since those processes would fail them. On a"
        " queue nobody serves such a task is always accepted: its jobs wait for their workers.",
    )

    api_tokens: Annotated[list[ApiToken], NoDecode] = Field(
        default_factory=list,
        description='Bearer tokens of the API, e.g. [{"name":"etl","scope":"trigger","token":"…"}];'
        " empty: no authentication (only allowed on a loopback address).",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Serve without DL_API_TOKENS on a non-loopback DL_HTTP_HOST.",
    )
    http_max_body_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        le=1_073_741_824,
        description="Larger request bodies are refused with 413 before they are read whole.",
    )
    http_allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated origins (https://ops.example.com) of front-ends on other"
        " sites that may change things through the API (and read its answers: CORS); any"
        " other site's request that would change something is refused with 403.",
    )
    session_secret: SecretStr | None = Field(
        default=None,
        description="The key that signs the dashboard's sessions (at least 32 characters),"
        " the same for every replica; unset: one made once and kept in the database.",
    )
    clusters: Annotated[dict[str, routing.ClusterSpec], NoDecode] = Field(
        default_factory=dict,
        description="Queues and process namespaces held by other PostgreSQL clusters than"
        ' DL_DB_DSN\'s, e.g. {"eu": {"dsn": "postgresql://…", "queues": ["eu.*", "billing"],'
        ' "namespaces": ["orders"]}} (docs/scale-out.md); unset: one cluster.',
    )

    @field_validator("db_dsn", "target_dsn", "db_direct_dsn")
    @classmethod
    def _check_dsn(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return normalise_dsn(value)  # asyncpg would fail on a bad one later, with a traceback

    @field_validator("db_read_dsn")
    @classmethod
    def _check_read_dsn(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return normalise_dsn(value, writes=False)  # a standby is what it is for

    @field_validator("cron", mode="before")
    @classmethod
    def _parse_cron(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():  # DL_CRON= : the default, none
            return []
        example = '[{"name": "nightly", "schedule": "0 3 * * *", "task": "t", "queue": "q"}]'
        return _json_list(value, example)

    @field_validator("cron")
    @classmethod
    def _distinct_cron(cls, value: list[CronSpec]) -> list[CronSpec]:
        if len({c.name for c in value}) < len(value):
            raise ValueError("two schedules have the same name")
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _parse_workers(cls, value: Any) -> Any:
        return _json_list(value, '[{"queue": "default", "concurrency": 1}]')

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return []
        return _json_list(value, '[{"name": "etl", "scope": "trigger", "token": "…"}]')

    @field_validator("api_tokens")
    @classmethod
    def _distinct_tokens(cls, value: list[ApiToken]) -> list[ApiToken]:
        if len({t.name for t in value}) < len(value):
            raise ValueError("two tokens have the same name")
        if len({t.token.get_secret_value() for t in value}) < len(value):
            raise ValueError("two entries have the same token")
        return value

    @model_validator(mode="after")
    def _no_open_public_api(self) -> Self:
        if (
            not self.api_tokens
            and not self.allow_unauthenticated
            and not is_loopback(self.http_host)
        ):
            raise ValueError(
                f"DL_HTTP_HOST={self.http_host} is reachable from other machines and"
                " DL_API_TOKENS is empty: set tokens, or DL_ALLOW_UNAUTHENTICATED=true"
            )
        return self

    @field_validator("workers")
    @classmethod
    def _unique_queues(cls, value: list[WorkerSpec]) -> list[WorkerSpec]:
        seen: set[str] = set()
        for spec in value:
            for queue in spec.served:
                if queue in seen:
                    raise ValueError(f"queue {queue!r} is listed twice")
                seen.add(queue)
        return value

    @field_validator("http_allowed_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("http_allowed_origins")
    @classmethod
    def _check_origins(cls, value: list[str]) -> list[str]:
        return [_origin(origin) for origin in value]

    @field_validator("session_secret")
    @classmethod
    def _long_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().strip()) < SESSION_SECRET_MIN_CHARS:
            raise ValueError(
                f"must be at least {SESSION_SECRET_MIN_CHARS} characters (e.g. openssl rand"
                " -hex 32): a short key is guessable"
            )
        return value

    @field_validator("pipeline_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator("clusters", mode="before")
    @classmethod
    def _parse_clusters(cls, value: Any) -> Any:
        return routing.parse(value)

    @model_validator(mode="after")
    def _clusters_apart(self) -> Self:
        try:
            routing.check_groups(self.clusters, self.db_dsn)
        except ValueError as exc:
            raise ValueError(f"{routing.VARIABLE}: {exc}") from None
        routing.check_shared_slots(self.cluster_map, [s.served for s in self.workers if s.shared])
        return self

    @property
    def asyncpg_dsn(self) -> str | None:
        """The DSN in the libpq form asyncpg accepts (no `+asyncpg`)."""
        if self.db_dsn is None:
            return None
        return "postgresql://" + self.db_dsn.split("://", 1)[1]

    @property
    def total_slots(self) -> int:
        """Worker slots over all served queues."""
        return sum(spec.concurrency for spec in self.workers)

    @property
    def cluster_map(self) -> routing.ClusterMap:
        """Which cluster holds each queue and namespace (`DL_CLUSTERS`)."""
        return routing.ClusterMap(self.clusters)


def env_name(field: str) -> str:
    """The environment variable that feeds settings field `field`."""
    if field in ("workers", "WORKERS_JSON"):
        return "WORKERS_JSON"
    return f"DL_{field.upper()}"


def unread_variables() -> list[str]:
    """A line for each variable of the environment or `.env` named like a setting (DL_…)
    that no setting reads (a typo, most likely: it would be ignored without a word), naming
    the setting's variable closest to it."""
    known = {env_name(name) for name in Settings.model_fields}
    env_file = Path(str(Settings.model_config.get("env_file")))
    found = {*os.environ, *(dotenv_values(env_file) if env_file.is_file() else {})}
    lines = []
    for name in sorted(found):
        variable = name.upper()
        if not variable.startswith("DL_") or variable in known:
            continue
        closest = difflib.get_close_matches(variable, sorted(known), n=1)
        hint = f" (did you mean {closest[0]}?)" if closest else ""
        lines.append(f"{name} is not a setting: it is ignored{hint}")
    return lines


def load_settings(**overrides: Any) -> Settings:
    """Read the settings, turning validation errors into one `ConfigError` line."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"]]
        message = first["msg"].removeprefix("Value error, ")
        if not loc:  # a check across settings: its message names the variables it concerns
            raise ConfigError(message) from None
        where = f" (item {'.'.join(loc[1:])})" if len(loc) > 1 else ""
        raise ConfigError(f"{env_name(loc[0])}{where}: {message}") from None
