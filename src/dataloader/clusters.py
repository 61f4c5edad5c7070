"""Queues on several PostgreSQL clusters (`DL_CLUSTERS`, see `dataloader.core.clusters` and
docs/scale-out.md): a client with `dataloader.Client`'s interface over one Client per cluster.

    async with ClusterClient.connect(load_settings()) as client:   # every cluster's pool
        await client.enqueue("eu.load", {"day": "2026-01-01"}, queue="eu.load")  # -> cluster eu
        state = await client.get(job_id)             # asks every cluster; state.cluster names it

What is routed, and how:

* by queue (the cluster holding it): `enqueue`, `enqueue_many` (a batch must stay within one
  cluster: one that spans two is refused before anything is written, as one transaction
  cannot write to two databases), `list`/`stats`/`throughput`/`cancel_many`/`retry_many`
  with a queue, `pause`, `resume`, `set_limits`, `queue_events`;
* by namespace: `processes.start/call/repair/remove/submit/get/events/list(namespace=…)`;
* to every cluster, by job id: `get`, `get_many`, `find`, `args`, `stages`, `events`,
  `wait`, `follow`, `cancel`, `retry` (the one cluster holding the job answers; when it is
  not found and a cluster does not answer, DatabaseUnavailable: it may be there);
* to every cluster, merged: `list` without a queue (newest first across clusters, with the
  same keyset cursor: a cursor is a position (created_at, job_id) in one order that every
  cluster shares), `stats`, `workers`, `awaited_tasks`. A merged read raises
  DatabaseUnavailable when a cluster does not answer (a partial answer would look whole),
  but for three made to survive an outage: `status` (the missing cluster is a warning),
  `throughput` (beside that warning) and `known_tasks` (the trigger check of the other
  clusters' queues); `statuses` reads each cluster apart.

Everything a job reads back names its cluster (`JobState.cluster`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import dataclasses
import heapq
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

from dataloader.client import Client, JobUpdate, _open_pool, _uuid
from dataloader.config import Settings, load_settings
from dataloader.context import (
    QUEUE_DSN_VARIABLE,
    AppContext,
    StartupHook,
    check_database,
    run_migrations,
)
from dataloader.core import clusters as routing
from dataloader.core.models import EnqueueResult, JobEvent, JobState, NewJob, QueueStats
from dataloader.core.queues import QueueEvent, QueueSettings, ThroughputPoint
from dataloader.core.routing import KnownTasks
from dataloader.exceptions import (
    ConfigError,
    DatabaseUnavailable,
    DataloaderError,
    InvalidJob,
    JobNotFound,
)
from dataloader.health import MaintenanceState, SystemStatus
from dataloader.logger.utils import mask_dsn
from dataloader.processes import Processes
from dataloader.storage import db, queries
from dataloader.storage.presence import LiveWorker, PublishedTask
from dataloader.storage.processes import ProcessPage
from dataloader.storage.repositories import BulkResult, JobPage, _cursor
from dataloader.tasks import TaskRegistry
from dataloader.workers.manager import WorkerManager

if TYPE_CHECKING:
    from dataloader.client import CallerConnection
    from dataloader.storage.db import Pool

T = TypeVar("T")

log = logging.getLogger(__name__)


def check_registry(clusters: routing.ClusterMap, registry: TaskRegistry) -> None:
    """ConfigError naming DL_CLUSTERS when this program's tasks would link two clusters: a
    stage (`then=`) on a queue of another cluster than its parent's, a processor on a queue of
    another cluster than its namespace's."""
    stages = []
    namespaces = {}
    for task in registry.tasks():
        for name in task.then:
            stage = registry.get(name)
            queue = stage.queue if stage is not None and stage.queue is not None else task.queue
            stages.append((task.name, name, task.queue, queue))
        if task.process is not None:
            namespaces[task.process.name] = task.process.queue
    try:
        routing.check_links(
            [*routing.stage_links(clusters, stages), *routing.namespace_links(clusters, namespaces)]
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def cluster_settings(settings: Settings, name: str) -> Settings:
    """The settings of one cluster's context and workers: its DSN, and only the queues and
    schedules it holds (each cluster's maintenance runs the schedules of its own queues)."""
    clusters = settings.cluster_map
    update: dict[str, Any] = {
        "workers": [w for w in settings.workers if clusters.of_queue(w.served[0]) == name],
        "cron": [c for c in settings.cron if clusters.of_queue(c.queue) == name],
        "clusters": {},
    }
    if name != routing.DEFAULT:
        # DL_DB_READ_DSN is a standby of the default cluster's (the others read their
        # primary), and DL_DB_DIRECT_DSN reaches the default cluster's primary: a group's DSN
        # reaches its server straight or through a session pooler
        update |= {
            "db_dsn": settings.clusters[name].dsn,
            "db_read_dsn": None,
            "db_direct_dsn": None,
        }
    return settings.model_copy(update=update)


def where(settings: Settings, name: str) -> str:
    """A cluster for messages: its name and DSN, the password masked."""
    dsn = settings.db_dsn if name == routing.DEFAULT else settings.clusters[name].dsn
    return f"cluster {name!r} ({mask_dsn(dsn) if dsn else 'embedded'})"


def _tagged(state: JobState | None, cluster: str) -> JobState | None:
    return None if state is None else dataclasses.replace(state, cluster=cluster)


class ClusterClient(Client):
    """`dataloader.Client` over several clusters (see the module's docstring): one Client per
    cluster in `clients` (DEFAULT's among them), routed by `clusters`. `maintenance` reads
    the default cluster's (each cluster's is in `statuses`)."""

    def __init__(
        self,
        clients: Mapping[str, Client],
        clusters: routing.ClusterMap,
        default_pool: Pool,
        *,
        settings: Settings | None = None,
        registry: TaskRegistry | None = None,
    ) -> None:
        settings = settings if settings is not None else load_settings()
        # its reads go through each cluster's client, which reads from its own standby (if any)
        own = settings.model_copy(update={"db_read_dsn": None})
        super().__init__(default_pool, settings=own, registry=registry)
        self.clusters = clusters
        self._clients = dict(clients)
        self._owned_pools: list[Pool] = []
        self.processes = ClusterProcesses(self)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_all(  # a name of its own: `Client.connect(dsn)` takes one DSN
        cls,
        settings: Settings | None = None,
        *,
        registry: TaskRegistry | None = None,
        pool_size: int = 4,
    ) -> AsyncIterator[ClusterClient]:
        """A client on pools of its own to every cluster of `settings` (DL_DB_DSN and
        DL_CLUSTERS), closed on exit. DatabaseUnavailable naming the cluster when one cannot
        be reached."""
        settings = settings if settings is not None else load_settings()
        if settings.asyncpg_dsn is None:
            raise ConfigError("DL_CLUSTERS needs DL_DB_DSN for a client: the default cluster")
        pools: dict[str, Pool] = {}
        try:
            for name in settings.cluster_map.names:
                dsn = cluster_settings(settings, name).asyncpg_dsn
                assert dsn is not None  # DEFAULT's checked above, the groups' are required
                try:
                    pools[name] = await _open_pool(dsn, max(2, pool_size), settings.db_timeout_sec)
                except DatabaseUnavailable as exc:
                    raise DatabaseUnavailable(f"{where(settings, name)}: {exc}") from None
            clients = {
                name: Client(pool, settings=cluster_settings(settings, name), registry=registry)
                for name, pool in pools.items()
            }
            client = cls(
                clients,
                settings.cluster_map,
                pools[routing.DEFAULT],
                settings=settings,
                registry=registry,
            )
        except BaseException:
            for pool in pools.values():
                await pool.close()
            raise
        client._owned_pools = list(pools.values())
        async with client:
            yield client

    async def close(self) -> None:
        """Close every cluster's client (and the pools `connect_all` opened)."""
        if self._origin is not None:
            return
        try:
            for client in self._clients.values():
                await client.close()
            await super().close()
        finally:
            pools, self._owned_pools = self._owned_pools, []
            for pool in pools:
                await pool.close()

    def exact(self) -> ClusterClient:
        """This client with every cluster's reads on its primary (see `Client.exact`)."""
        view = copy.copy(self)
        view._origin, view._owned_pools, view._actors = self._origin or self, [], {}
        view._clients = {name: c.exact() for name, c in self._clients.items()}
        view.processes = ClusterProcesses(view)
        return view

    def acting_as(self, actor: str) -> ClusterClient:
        """This client acting as `actor` on every cluster (see `Client.acting_as`)."""
        named = super().acting_as(actor)  # checks the name; its journal's `by`
        # a copy of the view `Client.acting_as` keeps: the clusters' clients are this one's
        view = copy.copy(named)
        assert isinstance(view, ClusterClient)
        view._clients = {name: c.acting_as(actor) for name, c in self._clients.items()}
        view.processes = ClusterProcesses(view)
        return view

    # routing ---------------------------------------------------------------------------------

    def of_queue(self, queue: str) -> tuple[str, Client]:
        """The cluster holding `queue`, and its client."""
        name = self.clusters.of_queue(queue)
        return name, self.on(name)

    def on(self, cluster: str) -> Client:
        """The client of one cluster; DatabaseUnavailable for one not reached yet (down
        since the start: `ClusterRuntime` joins it once it answers)."""
        client = self._clients.get(cluster)
        if client is None:
            raise DatabaseUnavailable(f"cluster {cluster!r} has not been reached yet")
        return client

    def join(self, cluster: str, client: Client) -> None:
        """Route to `cluster` through `client` from now on (a cluster reached late)."""
        self._clients[cluster] = client

    async def _each(
        self, call: Callable[[Client], Awaitable[T]]
    ) -> tuple[dict[str, T], dict[str, DatabaseUnavailable]]:
        """`call` on every cluster at once: the answers, and the clusters that gave none."""
        names = self.clusters.names
        answers = await asyncio.gather(
            *(self._call_on(name, call) for name in names), return_exceptions=True
        )
        found: dict[str, T] = {}
        down: dict[str, DatabaseUnavailable] = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, DatabaseUnavailable):
                down[name] = answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                found[name] = answer
        return found, down

    async def _call_on(self, name: str, call: Callable[[Client], Awaitable[T]]) -> T:
        return await call(self.on(name))

    async def _all(self, call: Callable[[Client], Awaitable[T]]) -> dict[str, T]:
        """`call` on every cluster; DatabaseUnavailable naming the first that gave no answer."""
        found, down = await self._each(call)
        _raise_down(down)
        return found

    async def _holder(self, job_id: uuid.UUID | str) -> tuple[str, Client, JobState]:
        """The cluster holding the job, its client and the job; JobNotFound when no cluster
        has it, DatabaseUnavailable when it is in none that answered and one did not."""
        wanted = _uuid(job_id)
        found, down = await self._each(lambda client: client.get(wanted))
        for name, state in found.items():
            if state is not None:
                return name, self.on(name), dataclasses.replace(state, cluster=name)
        _raise_down(down)
        raise JobNotFound(f"job {job_id} not found")

    # producers -------------------------------------------------------------------------------

    async def enqueue(
        self,
        task: str | Any,
        args: Any = None,
        *,
        lock_key: str | None = None,
        connection: CallerConnection | None = None,
        **options: Any,
    ) -> EnqueueResult:
        """As `Client.enqueue`, on the cluster holding the job's queue (`connection`, if
        given, must be a connection to that cluster)."""
        new = (
            task if isinstance(task, NewJob) else self.job(task, args, lock_key=lock_key, **options)
        )
        if isinstance(task, NewJob) and (args is not None or lock_key is not None or options):
            raise TypeError("enqueue(NewJob) takes no other job fields")
        _, client = self.of_queue(self._queue_of(new))
        return await client.enqueue(new, connection=connection)

    async def enqueue_many(
        self, jobs: Iterable[NewJob], *, connection: CallerConnection | None = None
    ) -> builtins.list[EnqueueResult]:
        """As `Client.enqueue_many`, on the cluster holding the batch's queues; InvalidJob
        (nothing written) for a batch whose queues are in two clusters."""
        batch = builtins.list(jobs)
        self._options(batch)  # every job checked (its type, its args) before routing
        clusters = self.clusters.split({self._queue_of(job) for job in batch})
        if len(clusters) > 1:
            raise InvalidJob(
                "queue",
                f"the batch spans clusters {sorted(clusters)} ({routing.VARIABLE}): one"
                " transaction writes to one database; send each cluster's jobs apart",
            )
        name = next(iter(clusters), routing.DEFAULT)
        return await self.on(name).enqueue_many(batch, connection=connection)

    def _queue_of(self, job: NewJob) -> str:
        """The queue `job` goes to: its own, else its task's (or the default queue)."""
        if job.queue is not None:
            return job.queue
        return self._options_of(job.task, self.registry.get(job.task)).queue or "default"

    # readers ---------------------------------------------------------------------------------

    async def get(self, job_id: uuid.UUID | str) -> JobState | None:
        try:
            return (await self._holder(job_id))[2]
        except JobNotFound:
            return None

    async def get_many(self, job_ids: Iterable[uuid.UUID | str]) -> dict[uuid.UUID, JobState]:
        ids = [_uuid(job_id) for job_id in job_ids]
        found, down = await self._each(lambda client: client.get_many(ids))
        states: dict[uuid.UUID, JobState] = {}
        for name, page in found.items():
            for job_id, state in page.items():
                states[job_id] = dataclasses.replace(state, cluster=name)
        if len(states) < len(set(ids)):
            _raise_down(down)
        return states

    async def stages(self, job_id: uuid.UUID | str, limit: int = 100) -> builtins.list[JobState]:
        name, client, _ = await self._holder(job_id)
        return [dataclasses.replace(s, cluster=name) for s in await client.stages(job_id, limit)]

    async def find(self, idempotency_key: str) -> JobState | None:
        found, down = await self._each(lambda client: client.find(idempotency_key))
        for name, state in found.items():
            if state is not None:
                return _tagged(state, name)
        _raise_down(down)
        return None

    async def args(self, job_id: uuid.UUID | str) -> tuple[Any, str | None]:
        return await (await self._holder(job_id))[1].args(job_id)

    async def list(
        self, *, queue: str | None = None, limit: int = 100, cursor: str | None = None, **where: Any
    ) -> JobPage:
        """As `Client.list`; without a queue, every cluster's page merged newest first. The
        cursor is the same position (created_at, job_id) in every cluster, so pages follow
        each other as on one cluster."""
        if queue is not None:
            name, client = self.of_queue(queue)
            page = await client.list(queue=queue, limit=limit, cursor=cursor, **where)
            return JobPage(
                [dataclasses.replace(j, cluster=name) for j in page.jobs], page.next_cursor
            )
        pages = await self._all(lambda client: client.list(limit=limit, cursor=cursor, **where))
        merged = heapq.merge(
            *(
                [dataclasses.replace(job, cluster=name) for job in page.jobs]
                for name, page in pages.items()
            ),
            key=lambda job: (job.created_at, job.job_id),
            reverse=True,
        )
        jobs = builtins.list(merged)
        more = len(jobs) > limit or any(page.next_cursor is not None for page in pages.values())
        jobs = jobs[:limit]
        return JobPage(jobs, _cursor(jobs[-1]) if more and jobs else None)

    async def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        if queue is not None:
            return await self.of_queue(queue)[1].stats(queue)
        merged: dict[str, QueueStats] = {}
        for name, stats in (await self._all(lambda client: client.stats())).items():
            for queue_name, figures in stats.items():
                # a queue's jobs left behind in a cluster that no longer holds it show only
                # where the routing sends the queue
                if queue_name not in merged or self.clusters.of_queue(queue_name) == name:
                    merged[queue_name] = figures
        return dict(sorted(merged.items()))

    async def status(self) -> SystemStatus:
        """Every cluster's status as one: the queues (`clusters` names each one's cluster),
        live processes and warnings of all, the default cluster's maintenance and table
        health. A cluster that does not answer is a warning (its queues are left out);
        DatabaseUnavailable only when none answers. `statuses` gives each apart."""
        statuses, down = await self._each(lambda client: client.status())
        if not statuses:
            _raise_down(down)
        first = statuses.get(routing.DEFAULT) or next(iter(statuses.values()))
        queues: dict[str, QueueStats] = {}
        held: dict[str, str] = {}
        for name, state in statuses.items():
            for queue, figures in state.queues.items():
                if queue not in queues or self.clusters.of_queue(queue) == name:
                    queues[queue], held[queue] = figures, name
        warnings = [
            f"cluster {name!r} does not answer: its queues are not shown ({exc})"
            for name, exc in down.items()
        ]
        warnings += [
            f"cluster {name!r}: {warning}" if name != routing.DEFAULT else warning
            for name, state in statuses.items()
            for warning in state.warnings
        ]
        return dataclasses.replace(
            first,
            queues=dict(sorted(queues.items())),
            live_workers=[w for s in statuses.values() for w in s.live_workers],
            warnings=warnings,
            clusters=held,
        )

    async def statuses(self) -> dict[str, SystemStatus | DatabaseUnavailable]:
        """Each cluster's status apart (as `Client.status`), or why it gave none."""
        found, down = await self._each(lambda client: client.status())
        return {name: found.get(name) or down[name] for name in self.clusters.names}

    async def throughput(
        self, *, span_sec: int = 3600, step_sec: int = 60, queue: str | None = None
    ) -> builtins.list[ThroughputPoint]:
        if queue is not None:
            return await self.of_queue(queue)[1].throughput(
                span_sec=span_sec, step_sec=step_sec, queue=queue
            )
        # the clusters that answer (a chart beside `status`, which warns of the others)
        series, down = await self._each(
            lambda client: client.throughput(span_sec=span_sec, step_sec=step_sec)
        )
        if not series:
            _raise_down(down)
        # the clusters' clocks differ slightly: steps are summed where they start alike
        summed: dict[datetime, ThroughputPoint] = {}
        for points in series.values():
            for point in points:
                known = summed.get(point.at)
                summed[point.at] = point if known is None else _sum(known, point)
        return [summed[at] for at in sorted(summed)]

    async def workers(self) -> builtins.list[LiveWorker]:
        return [w for found in (await self._all(lambda c: c.workers())).values() for w in found]

    async def published_tasks(self) -> builtins.list[PublishedTask]:
        merged: dict[str, PublishedTask] = {}
        for found in (await self._all(lambda c: c.published_tasks())).values():
            for task in found:
                known = merged.get(task.name)
                merged[task.name] = (
                    task
                    if known is None
                    else dataclasses.replace(known, workers=[*known.workers, *task.workers])
                )
        return [merged[name] for name in sorted(merged)]

    async def maintenance(self) -> MaintenanceState:
        """The default cluster's maintenance (`statuses` has every cluster's)."""
        return await self.on(routing.DEFAULT).maintenance()

    async def awaited_tasks(self) -> dict[str, builtins.list[str]]:
        merged: dict[str, builtins.list[str]] = {}
        for found in (await self._all(lambda c: c.awaited_tasks())).values():
            for task, queues in found.items():
                merged.setdefault(task, []).extend(queues)
        return merged

    async def known_tasks(self) -> KnownTasks:
        """What the live processes of the clusters that answer know: a cluster that does not
        answer takes its processes' tasks and queues with it, so its queues look unserved
        (a trigger there is not refused as unrunnable: it fails with the cluster anyway),
        while triggers on the other clusters' queues are checked as usual."""
        definitions: dict[str, frozenset[str | None]] = {}
        served: frozenset[str] = frozenset()
        for known in (await self._each(lambda c: c.known_tasks()))[0].values():
            for task, queues in known.definitions.items():
                definitions[task] = definitions.get(task, frozenset()) | queues
            served |= known.served
        return KnownTasks(definitions, served)

    async def events(
        self, job_id: uuid.UUID | str, *, after: int = 0, limit: int | None = None
    ) -> builtins.list[JobEvent]:
        try:
            client = (await self._holder(job_id))[1]
        except JobNotFound:
            return []
        return await client.events(job_id, after=after, limit=limit)

    async def wait(self, job_id: uuid.UUID | str, timeout: float | None = None) -> JobState:
        name, client, _ = await self._holder(job_id)
        return dataclasses.replace(await client.wait(job_id, timeout), cluster=name)

    async def follow(
        self,
        job_id: uuid.UUID | str,
        *,
        after: int = 0,
        poll_sec: float = 0.5,
        idle_sec: float | None = None,
    ) -> AsyncIterator[JobUpdate]:
        client = (await self._holder(job_id))[1]
        async for update in client.follow(
            job_id, after=after, poll_sec=poll_sec, idle_sec=idle_sec
        ):
            yield update

    @contextlib.asynccontextmanager
    async def ends_of(self, job_id: uuid.UUID | str) -> AsyncIterator[asyncio.Event]:
        try:
            client = (await self._holder(job_id))[1]
        except JobNotFound:
            client = self.on(routing.DEFAULT)
        async with client.ends_of(job_id) as woken:
            yield woken

    # changes ---------------------------------------------------------------------------------

    async def cancel(self, job_id: uuid.UUID | str) -> JobState:
        name, client, _ = await self._holder(job_id)
        return dataclasses.replace(await client.cancel(job_id), cluster=name)

    async def retry(self, job_id: uuid.UUID | str) -> JobState:
        name, client, _ = await self._holder(job_id)
        return dataclasses.replace(await client.retry(job_id), cluster=name)

    async def pause(self, queue: str) -> QueueSettings:
        return await self.of_queue(queue)[1].pause(queue)

    async def resume(self, queue: str) -> QueueSettings:
        return await self.of_queue(queue)[1].resume(queue)

    async def set_limits(
        self,
        queue: str,
        *,
        max_running: int | None = None,
        max_running_per_partition: int | None = None,
        max_per_second: float | None = None,
    ) -> QueueSettings:
        return await self.of_queue(queue)[1].set_limits(
            queue,
            max_running=max_running,
            max_running_per_partition=max_running_per_partition,
            max_per_second=max_per_second,
        )

    async def queue_events(
        self, queue: str, *, after: int = 0, limit: int | None = None
    ) -> builtins.list[QueueEvent]:
        return await self.of_queue(queue)[1].queue_events(queue, after=after, limit=limit)

    async def cancel_many(self, *, limit: int = 1000, **where: Any) -> BulkResult:
        return await self._bulk("cancel_many", limit, where)

    async def retry_many(self, *, limit: int = 1000, **where: Any) -> BulkResult:
        return await self._bulk("retry_many", limit, where)

    async def _bulk(self, method: str, limit: int, where: dict[str, Any]) -> BulkResult:
        """A change by filter: on the queue's cluster, or cluster after cluster (DEFAULT
        first) within `limit` jobs looked at in all."""
        queue = where.get("queue")
        names = [self.clusters.of_queue(queue)] if queue is not None else self.clusters.names
        matched, changed, more = 0, [], False
        for i, name in enumerate(names):
            done: BulkResult = await getattr(self.on(name), method)(limit=limit - matched, **where)
            matched += done.matched
            changed.extend(done.changed)
            if done.more or (matched >= limit and i < len(names) - 1):
                more = True
                break
        return BulkResult(matched, changed, more)


def _raise_down(down: Mapping[str, DatabaseUnavailable]) -> None:
    for name, exc in down.items():
        raise DatabaseUnavailable(f"cluster {name!r}: {exc}") from exc


def _sum(a: ThroughputPoint, b: ThroughputPoint) -> ThroughputPoint:
    return ThroughputPoint(
        a.at,
        a.succeeded + b.succeeded,
        a.failed + b.failed,
        a.retried + b.retried,
        a.canceled + b.canceled,
        a.lost + b.lost,
    )


class ClusterProcesses(Processes):
    """Durable processes over several clusters: each namespace's in the cluster holding it
    (`DL_CLUSTERS` "namespaces"); a task's response from the cluster holding the task."""

    def __init__(self, client: ClusterClient) -> None:
        super().__init__(client)
        self._clusters = client

    def _of(self, namespace: str, queue: str | None = None) -> Processes:
        """The namespace's cluster's processes; InvalidJob for a queue of another cluster."""
        if queue is not None:
            try:
                routing.check_queue_of_namespace(self._clusters.clusters, namespace, queue)
            except ValueError as exc:
                raise InvalidJob("queue", str(exc)) from None
        name = self._clusters.clusters.of_namespace(namespace)
        return self._clusters.on(name).processes

    async def start(self, namespace: str, process_id: str, args: Any = None, **kw: Any) -> Any:
        return await self._of(namespace, kw.get("queue")).start(namespace, process_id, args, **kw)

    async def call(self, namespace: str, process_id: str, args: Any = None, **kw: Any) -> Any:
        return await self._of(namespace).call(namespace, process_id, args, **kw)

    async def repair(self, namespace: str, process_id: str, args: Any = None, **kw: Any) -> Any:
        return await self._of(namespace).repair(namespace, process_id, args, **kw)

    async def remove(self, namespace: str, process_id: str, **kw: Any) -> None:
        await self._of(namespace).remove(namespace, process_id, **kw)

    async def submit(
        self, namespace: str, process_id: str, kind: Any, args: Any = None, **kw: Any
    ) -> uuid.UUID:
        return await self._of(namespace, kw.get("queue")).submit(
            namespace, process_id, kind, args, **kw
        )

    def queue_of(self, namespace: str, queue: str | None = None) -> str:
        return self._of(namespace, queue).queue_of(namespace, queue)

    async def response(self, task_id: uuid.UUID | str, timeout: float | None = None) -> Any:
        client = (await self._clusters._holder(task_id))[1]
        return await client.processes.response(task_id, timeout)

    async def get(self, namespace: str, process_id: str) -> Any:
        return await self._of(namespace).get(namespace, process_id)

    async def list(
        self,
        *,
        namespace: str | None = None,
        limit: int = 100,
        cursor: int | None = None,
        **kw: Any,
    ) -> ProcessPage:
        """A namespace's processes from its cluster, pages as on one cluster. Without a
        namespace: each cluster's newest `limit`, merged newest first, on one page (process
        cursors are numbers of one database: they do not page across clusters)."""
        if namespace is not None:
            return await self._of(namespace).list(
                namespace=namespace, limit=limit, cursor=cursor, **kw
            )
        if len(self._clusters.clusters.names) == 1:
            return await self._clusters.on(routing.DEFAULT).processes.list(
                limit=limit, cursor=cursor, **kw
            )
        pages = await self._clusters._all(lambda c: c.processes.list(limit=limit, **kw))
        merged = sorted(
            (p for page in pages.values() for p in page.processes),
            key=lambda p: p.created_at,
            reverse=True,
        )
        return ProcessPage(merged[:limit], None)

    async def counts(self) -> dict[tuple[str, str], int]:
        merged: dict[tuple[str, str], int] = {}
        for found in (await self._clusters._all(lambda c: c.processes.counts())).values():
            for key, count in found.items():
                merged[key] = merged.get(key, 0) + count
        return merged

    async def events(self, namespace: str, process_id: str, **kw: Any) -> Any:
        return await self._of(namespace).events(namespace, process_id, **kw)


class ClusterRuntime:
    """What `Runner` runs with `DL_CLUSTERS`: one AppContext per cluster (its pool, its
    migrations), one WorkerManager per cluster whose queues this process serves (its own
    listener, maintenance leadership, presence), and the `ClusterClient` over all of them,
    which every context offers as its `client` (a task's `ctx.client` routes too).

    One cluster down degrades only its queues. The default cluster must answer at start; a
    group's cluster that cannot be reached then (refused or unanswered connections) is
    warned of and joined in the background once it answers (its context opened, its workers
    started), while the others run; one that answers but cannot be used (no such database,
    refused credentials, no schema) stops the start, named. Once running, a cluster that goes
    down stops only its own queues: its workers, listener and pool wait for it and carry on
    when it is back."""

    def __init__(
        self,
        settings: Settings,
        registry: TaskRegistry,
        *,
        run_workers: bool,
        pool: Pool | None,
        startup: StartupHook | None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self._run_workers = run_workers
        self._pool = pool
        self._startup = startup
        self.contexts: dict[str, AppContext] = {}
        self.managers: dict[str, WorkerManager] = {}
        self._client: ClusterClient | None = None
        #: The background joins of clusters not reached at start.
        self._joining: dict[str, asyncio.Task[None]] = {}

    @property
    def client(self) -> ClusterClient:
        if self._client is None:
            raise RuntimeError("the Runner is not started")
        return self._client

    async def start(self) -> None:
        """Open every cluster, then start the workers of those this process serves; on any
        failure, close what was opened and raise one line naming the cluster."""
        clusters = self.settings.cluster_map
        check_registry(clusters, self.registry)
        try:
            unreached = []
            for name in clusters.names:
                try:
                    self.contexts[name] = await self._open(name)
                except DatabaseUnavailable as exc:
                    if name == routing.DEFAULT or not unreachable(exc):
                        raise
                    log.warning("%s: its queues wait until it answers", exc)
                    unreached.append(name)
            await _one_database_each(self.contexts)
            default = self.contexts[routing.DEFAULT]
            client = ClusterClient(
                {name: context.client for name, context in self.contexts.items()},
                clusters,
                default.pool,
                settings=self.settings,
                registry=self.registry,
            )
            self._client = client
            for context in self.contexts.values():
                context.client = client
            if self._startup is not None:
                await default._start(self._startup)
                for context in self.contexts.values():
                    context.resources = default.resources
            for name, context in self.contexts.items():
                await self._serve(name, context)
            for name in unreached:
                self._joining[name] = asyncio.create_task(
                    self._join(name), name=f"dataloader-join-cluster-{name}"
                )
        except BaseException:
            await self.stop(0)
            raise

    async def _open(self, name: str) -> AppContext:
        """The context of cluster `name` (its errors one line naming it)."""
        with _naming(self.settings, name):
            return await AppContext.open(
                cluster_settings(self.settings, name),
                self._registry_of(name),
                pool=self._pool if name == routing.DEFAULT else None,
            )

    async def _serve(self, name: str, context: AppContext) -> None:
        """Start the workers of cluster `name` if this process serves queues of it."""
        if self._run_workers and context.settings.workers:
            manager = WorkerManager(context, self._registry_of(name))
            with _naming(self.settings, name):
                await manager.start()
            self.managers[name] = manager

    async def _join(self, name: str) -> None:
        """Open cluster `name` once it answers (every JOIN_RETRY_SEC, doubling to
        JOIN_RETRY_MAX_SEC), then route to it and start its workers."""
        delay = JOIN_RETRY_SEC
        said = ""  # the last reason logged: each new one once, not every try
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, JOIN_RETRY_MAX_SEC)
            try:
                context = await self._open(name)
            except Exception as exc:  # still down, or not usable yet: try again
                reason = (
                    f"{type(exc).__name__}: {exc}"
                    if not isinstance(exc, DataloaderError)
                    else str(exc)
                )
                if reason != said:
                    log.warning(
                        "not joined yet, tried again every %.0fs at most: %s",
                        JOIN_RETRY_MAX_SEC,
                        reason,
                    )
                    said = reason
                continue
            try:
                await _one_database_each({**self.contexts, name: context})
                self.client.join(name, context.client)
                context.client = self.client
                context.resources = self.contexts[routing.DEFAULT].resources
                self.contexts[name] = context
                await self._serve(name, context)
            except Exception as exc:  # a start that failed is tried again
                log.warning("%s: %s", where(self.settings, name), exc)
                self.contexts.pop(name, None)
                self.client._clients.pop(name, None)
                with contextlib.suppress(Exception):
                    await context.close()
                continue
            log.info("%s answers: its queues run", where(self.settings, name))
            return

    def _registry_of(self, name: str) -> TaskRegistry:
        """The tasks of one cluster's workers: all but those with a cron schedule on a queue of
        another cluster (whose scheduler runs there)."""
        clusters = self.settings.cluster_map
        return self.registry.only(
            lambda t: t.cron is None or t.queue is None or clusters.of_queue(t.queue) == name
        )

    async def stop(self, timeout: float) -> None:
        """Stop every cluster's workers at once (`hurry` reaches them meanwhile), then close
        the contexts."""
        joining, self._joining = self._joining, {}
        for task in joining.values():
            task.cancel()
        for task in joining.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            results = await asyncio.gather(
                *(manager.stop(timeout) for manager in self.managers.values()),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        finally:
            self.managers = {}
            contexts, self.contexts = self.contexts, {}
            for context in contexts.values():
                with contextlib.suppress(Exception):  # every context closes
                    await context.close()
            self._client = None

    def hurry(self) -> None:
        for manager in self.managers.values():
            manager.hurry()

    async def wait_idle(self) -> None:
        await asyncio.gather(*(manager.wait_idle() for manager in self.managers.values()))


async def check_clusters(settings: Settings, registry: TaskRegistry) -> list[str]:
    """Before a service or worker process starts (one line, not a traceback from its start):
    the tasks link no two clusters (`check_registry`), and each group's cluster that answers
    runs a recent enough PostgreSQL and holds the schema, migrated here with DL_AUTO_MIGRATE.
    The clusters that do not answer (joined once they do, see `ClusterRuntime`)."""
    check_registry(settings.cluster_map, registry)
    unreached = []
    for name, spec in settings.clusters.items():
        try:
            with _naming(settings, name):
                await check_database(spec.asyncpg_dsn, migrated=not settings.auto_migrate)
                if settings.auto_migrate:
                    await run_migrations(spec.asyncpg_dsn)
        except DatabaseUnavailable as exc:
            if not unreachable(exc):
                raise
            unreached.append(name)
    return unreached


#: How soon a cluster not reached at start is tried again, and at most how long between tries.
JOIN_RETRY_SEC: Final = 0.5
JOIN_RETRY_MAX_SEC: Final = 10.0


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is a connection refused, cut or unanswered:
    a cluster down, not a cluster misconfigured."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, db.CONNECTION_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _one_database_each(contexts: Mapping[str, AppContext]) -> None:
    """ConfigError when two clusters are one database reached by two DSNs (another host
    name, other options): its queues would be served as two clusters' and its jobs found in
    both."""
    seen: dict[tuple[Any, ...], str] = {}
    for name, context in contexts.items():
        row = await context.pool.fetchrow(queries.DATABASE_IDENTITY)
        assert row is not None  # a SELECT without FROM returns its row
        identity = tuple(row)
        if identity in seen:
            raise ConfigError(
                f"{routing.VARIABLE}: clusters {seen[identity]!r} and {name!r} reach one"
                f" database ({row['database']!r}): give each group a cluster of its own"
            )
        seen[identity] = name


@contextlib.contextmanager
def _naming(settings: Settings, name: str) -> Iterator[None]:
    """A failure to reach or use a group's cluster, as one line naming DL_CLUSTERS and the
    cluster (the password masked); the default cluster's already names DL_DB_DSN."""
    try:
        yield
    except DataloaderError as exc:
        if name == routing.DEFAULT:
            raise
        kind = next(
            k for k in (DatabaseUnavailable, ConfigError, DataloaderError) if isinstance(exc, k)
        )
        # the checks shared with DL_DB_DSN name it: this DSN is another setting's
        text = str(exc).removeprefix(f"{QUEUE_DSN_VARIABLE}: ")
        raise kind(f"{routing.VARIABLE}, {where(settings, name)}: {text}") from None
