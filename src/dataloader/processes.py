"""Durable processes as callers see them: `client.processes`.

    @dataloader.process("orders", step_timeout=30)
    async def order(task: ProcessTask, process: Process) -> ProcessResult:
        if task.kind is TaskKind.INIT:
            return ProcessResult(events=[{"created": task.args}], action=SetTimer(in_sec=3600))
        ...

    async with dataloader.Client.connect(dsn) as client:
        await client.processes.start("orders", "o-1", {"total": 10})
        answer = await client.processes.call("orders", "o-1", {"paid": 10}, timeout=5)

`start`, `call` and `repair` enqueue a task of the process (a job of its namespace's queue)
and wait for the processor's response; `submit` enqueues only, and `response` waits for a task
submitted earlier (after a ProcessTimeout, say). What is accepted where is decided by
`core.processes.admit`; every refusal raises before anything is written.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from dataloader import metrics
from dataloader.base import JobStatus
from dataloader.core import limits
from dataloader.core.models import DEFAULT_PRIORITY, NewJob
from dataloader.core.processes import (
    TASK_PREFIX,
    ZOMBIE_ATTEMPT,
    Event,
    Process,
    ProcessFacts,
    ProcessStatus,
    Refusal,
    TaskArgs,
    TaskKind,
    admit,
    admit_start,
    check_namespace,
    check_process_id,
    idempotency_key_of,
    lock_key_of,
    namespace_of,
    priority_of,
    refusal_of,
    task_name_of,
)
from dataloader.exceptions import (
    IdempotencyConflict,
    InvalidJob,
    JobNotFound,
    ProcessConflict,
    ProcessNotFound,
    ProcessTaskFailed,
    ProcessTimeout,
)
from dataloader.storage import processes as store
from dataloader.storage.connections import Connections
from dataloader.storage.db import AnyConnection
from dataloader.storage.processes import ProcessPage
from dataloader.storage.repositories import enqueue

if TYPE_CHECKING:
    from dataloader.client import Client

#: How long `start`, `call`, `repair` and `remove` wait for the response by default.
DEFAULT_TIMEOUT_SEC: Final = 30.0
#: Largest page of `list` and `events`.
MAX_PAGE: Final = 1000

_REFUSALS: Final = {
    Refusal.IN_ERROR: "process {id!r} of namespace {ns!r} is in error: only a repair is accepted",
    Refusal.NOT_IN_ERROR: "process {id!r} of namespace {ns!r} is not in error: there is nothing"
    " to repair",
    Refusal.STARTED_WITH_OTHER_ARGS: "process {id!r} of namespace {ns!r} was started with other"
    " args",
}


class Processes:
    """Durable processes through a `Client`: its connections, its task registry (a namespace
    whose processor this program has gives its queue and priority; any other's tasks go to
    the queue the process was started on), its actor in the journal."""

    def __init__(self, client: Client) -> None:
        self._client = client

    # tasks ----------------------------------------------------------------------------------

    async def start(
        self,
        namespace: str,
        process_id: str,
        args: Any = None,
        *,
        metadata: Mapping[str, Any] | None = None,
        queue: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_SEC,
    ) -> Any:
        """Start the process `process_id` of `namespace` with `args` and return its init
        task's response. A start of a live process started with the same args returns that
        start's response; with other args, ProcessConflict. `queue` (default: the
        namespace's, else its name) is where its tasks run."""
        return await self._submit_and_respond(
            timeout, namespace, process_id, TaskKind.INIT, args, metadata=metadata, queue=queue
        )

    async def call(
        self,
        namespace: str,
        process_id: str,
        args: Any = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_SEC,
    ) -> Any:
        """Call the process and return its processor's response. Calls run one at a time,
        in the order they arrive. With `idempotency_key`, a repeated call is the same task:
        it returns that task's response (waiting for it if need be). ProcessNotFound,
        ProcessConflict (the process is in error), ProcessTaskFailed, ProcessTimeout."""
        return await self._ask(namespace, process_id, TaskKind.CALL, args, idempotency_key, timeout)

    async def repair(
        self,
        namespace: str,
        process_id: str,
        args: Any = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_SEC,
    ) -> Any:
        """Repair a process in `error`: its processor is called with a `repair` task, and
        its success returns the process to `running`. Its response, as for `call`."""
        return await self._ask(
            namespace, process_id, TaskKind.REPAIR, args, idempotency_key, timeout
        )

    async def _ask(
        self,
        namespace: str,
        process_id: str,
        kind: TaskKind,
        args: Any,
        idempotency_key: str | None,
        timeout: float | None,
    ) -> Any:
        return await self._submit_and_respond(
            timeout, namespace, process_id, kind, args, idempotency_key=idempotency_key
        )

    async def remove(
        self, namespace: str, process_id: str, *, timeout: float | None = DEFAULT_TIMEOUT_SEC
    ) -> None:
        """Remove the process, after the task it runs (if any): its pending timer and queued
        tasks are canceled, and its id is free for a new start at once. Its row and history
        are kept, invisible to readers, for DL_PRUNE_REMOVED_PROCESSES_AFTER_SEC (7 days by
        default; 0: forever), then the pruner deletes them."""
        await self._submit_and_respond(timeout, namespace, process_id, TaskKind.REMOVE)

    async def _submit_and_respond(
        self,
        timeout: float | None,
        namespace: str,
        process_id: str,
        kind: TaskKind,
        args: Any = None,
        *,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        queue: str | None = None,
    ) -> Any:
        """Submit a task and return its response (see `submit` and `response`). The task's
        end is watched for from before the task is written: its job is read once, when its
        end is heard."""
        task_id = uuid.uuid4()
        async with self._client._finished.watch(task_id, until_listening=False) as woken:
            submitted = await self._submit(
                namespace, process_id, kind, args, idempotency_key, metadata, queue, task_id
            )
            # a repeated call is the task that holds its key: its end may be long past
            return await self._respond(submitted, timeout, woken if submitted == task_id else None)

    async def submit(
        self,
        namespace: str,
        process_id: str,
        kind: TaskKind | str,
        args: Any = None,
        *,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        queue: str | None = None,
    ) -> uuid.UUID:
        """Enqueue a task of the process (init, call, repair or remove) without waiting for
        it; its id, to pass to `response`. Refusals raise before anything is written."""
        return await self._submit(
            namespace, process_id, kind, args, idempotency_key, metadata, queue, None
        )

    async def _submit(
        self,
        namespace: str,
        process_id: str,
        kind: TaskKind | str,
        args: Any,
        idempotency_key: str | None,
        metadata: Mapping[str, Any] | None,
        queue: str | None,
        task_id: uuid.UUID | None,
    ) -> uuid.UUID:
        """`submit`, the new task's id being `task_id` when given."""
        started = time.perf_counter()
        kind = TaskKind(kind)
        if kind is TaskKind.TIMEOUT:
            raise ValueError("a timeout task is set by the processor, not submitted")
        namespace = _checked("namespace", check_namespace, namespace)
        process_id = _checked("process_id", check_process_id, process_id)
        if idempotency_key is not None:
            _checked("idempotency_key", limits.check_idempotency_key, idempotency_key)
        definition = self._client.registry.namespace(namespace)
        args_json = _checked("args", _json, args)
        # an init takes the id and enqueues its task at once; another task is one insert
        # after a read: a process removed or put in error in between is what the task
        # finds when it runs (`core.processes.before_step`), as it would a moment later
        async with (
            self._client._connections.connection() as conn,
            conn.transaction() if kind is TaskKind.INIT else contextlib.nullcontext(),
        ):
            if kind is TaskKind.INIT:
                metadata_json = _checked("metadata", _metadata_json, metadata)
                facts, new = await store.start_process(
                    conn,
                    namespace,
                    process_id,
                    self.queue_of(namespace, queue),
                    args_json,
                    metadata_json,
                )
                if not new and (refusal := admit_start(facts, args_json)) is not None:
                    raise refusal_error(refusal, namespace, process_id)
                key: str | None = idempotency_key_of(facts.process_ref, kind, "")
            else:
                found = await store.process_facts(conn, namespace, process_id)
                repeated = await self._repeated(
                    conn, namespace, process_id, kind, found, idempotency_key
                )
                if repeated is not None:
                    # the repeat of a task (its answer lost, say): answered as that task
                    # was, whatever the process became since
                    facts, key = repeated
                else:
                    refusal = admit(kind, found)
                    if found is None or refusal is not None:
                        raise refusal_error(refusal or Refusal.NOT_FOUND, namespace, process_id)
                    facts = found
                    key = (
                        None
                        if idempotency_key is None
                        else idempotency_key_of(facts.process_ref, kind, idempotency_key)
                    )
            priority = definition.priority if definition is not None else DEFAULT_PRIORITY
            job = NewJob(
                task=task_name_of(namespace),
                lock_key=lock_key_of(namespace, process_id),
                args=TaskArgs(facts.process_ref, process_id, kind, args).as_job_args(),
                queue=facts.queue,
                idempotency_key=key,
                priority=priority_of(False, priority),
                max_attempts=definition.max_attempts if definition else ZOMBIE_ATTEMPT,
            )
            try:
                result = await enqueue(conn, job, actor=self._client.actor, job_id=task_id)
            except IdempotencyConflict:
                raise ProcessConflict(
                    f"idempotency_key {idempotency_key!r} already names a {kind.value} of"
                    f" process {process_id!r} with other args",
                    Refusal.KEY_REUSED.value,
                ) from None
        metrics.observe_process_stage("request_preparing", namespace, time.perf_counter() - started)
        return result.job_id

    @staticmethod
    async def _repeated(
        conn: AnyConnection,
        namespace: str,
        process_id: str,
        kind: TaskKind,
        live: ProcessFacts | None,
        idempotency_key: str | None,
    ) -> tuple[ProcessFacts, str] | None:
        """The incarnation and key of the task that `idempotency_key` names already (of the
        live process, else of its newest removed incarnation, removed by that task perhaps),
        or None: the request is a new task."""
        if idempotency_key is None:
            return None
        facts = live or await store.removed_facts(conn, namespace, process_id)
        if facts is None:
            return None
        key = idempotency_key_of(facts.process_ref, kind, idempotency_key)
        return None if await store.key_holder(conn, key) is None else (facts, key)

    def queue_of(self, namespace: str, queue: str | None = None) -> str:
        """The queue a new process of `namespace` runs its tasks on: its processor's, when
        this program has it (`queue`, if given, must be that one: InvalidJob), else `queue`,
        else the namespace's name."""
        definition = self._client.registry.namespace(namespace)
        own = None if definition is None else definition.queue
        if queue is not None and own is not None and queue != own:
            raise InvalidJob("queue", f"namespace {namespace!r} runs on queue {own!r}")
        return str(_checked("queue", limits.check_name, queue or own or namespace))

    async def response(self, task_id: uuid.UUID | str, timeout: float | None = None) -> Any:
        """The response of a task submitted earlier, once it has ended (within `timeout`
        seconds, else ProcessTimeout: the task goes on). A task that ended without one raises
        what its end meant, whatever the process became since: ProcessNotFound (the process
        was removed before it ran), ProcessConflict (the process was or went in error before
        it ran), ProcessTaskFailed (its processor failed, putting the process in error; or it
        was canceled)."""
        task_id = task_id if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id))
        return await self._respond(task_id, timeout, None)

    async def _respond(
        self, task_id: uuid.UUID, timeout: float | None, watching: asyncio.Event | None
    ) -> Any:
        """`response`; `watching`: the event of a watch of the task entered before it was
        written (`Client._wait_heard`)."""
        try:
            async with asyncio.timeout(timeout):
                state, heard = await self._client._wait_heard(task_id, watching)
        except TimeoutError:
            raise ProcessTimeout(task_id, timeout) from None
        namespace = namespace_of(state.task)
        if namespace is None or state.lock_key is None:
            raise JobNotFound(f"job {task_id} is not a task of a process")
        if heard is not None:
            metrics.observe_process_stage("notification", namespace, heard)
        if state.status is JobStatus.SUCCEEDED:
            return state.result
        # what the task's end says, not what the process is now: a task asked for again
        # later answers as it did when it ended
        namespace, process_id = _process_of_key(state.lock_key)
        refusal = refusal_of(state.error)
        if refusal is not None:
            raise refusal_error(refusal, namespace, process_id)
        raise ProcessTaskFailed(
            f"task {task_id} of process {process_id!r} ended {state.status.value}"
            + (f": {state.error}" if state.error else ""),
            task_id,
        )

    # readers --------------------------------------------------------------------------------

    async def get(self, namespace: str, process_id: str) -> Process | None:
        """The live process (with its pending timer, without its history), or None."""
        async with self._client._connections.connection() as conn:
            return await store.get_process(conn, namespace, process_id)

    async def list(
        self,
        *,
        namespace: str | None = None,
        status: ProcessStatus | str | None = None,
        limit: int = 100,
        cursor: int | None = None,
    ) -> ProcessPage:
        """Live processes newest first, of a namespace and a status when given; `cursor` is
        the `next_cursor` of the previous page. May be a little stale (DL_DB_READ_DSN)."""
        _page(limit)
        wanted = None if status is None else ProcessStatus(status)

        async def read(on: Connections) -> ProcessPage:
            async with on.connection() as conn:
                return await store.list_processes(
                    conn, namespace=namespace, status=wanted, limit=limit, before=cursor
                )

        return await self._client._stale(read)

    async def counts(self) -> dict[tuple[str, str], int]:
        """Live processes by (namespace, status). May be a little stale (DL_DB_READ_DSN)."""

        async def read(on: Connections) -> dict[tuple[str, str], int]:
            async with on.connection() as conn:
                return await store.count_processes(conn)

        return await self._client._stale(read)

    async def events(
        self, namespace: str, process_id: str, *, after: int = 0, limit: int = 100
    ) -> builtins.list[Event]:
        """The process's history, oldest first: the events after event `after`, `limit` at
        most. ProcessNotFound if there is no such live process."""
        _page(limit)
        if after < 0:
            raise ValueError("after must be 0 or more")
        async with self._client._connections.connection() as conn:
            events = await store.process_events(conn, namespace, process_id, after, limit)
            if not events and await store.process_facts(conn, namespace, process_id) is None:
                raise ProcessNotFound(namespace, process_id)
        return events


def refusal_error(refusal: Refusal, namespace: str, process_id: str) -> Exception:
    """The exception a caller gets for `refusal` (see `core.processes.admit`)."""
    if refusal is Refusal.NOT_FOUND:
        return ProcessNotFound(namespace, process_id)
    message = _REFUSALS[refusal].format(id=process_id, ns=namespace)
    return ProcessConflict(message, refusal.value)


def _process_of_key(lock_key: str) -> tuple[str, str]:
    """The namespace and id whose tasks share `lock_key` (see `core.processes.lock_key_of`)."""
    namespace, process_id = json.loads(lock_key[len(TASK_PREFIX) :])
    return namespace, process_id


def _json(value: Any) -> str:
    """A task's args as JSON text: a JSON object jsonb can store (checked as a job's args
    are), or null."""
    return "null" if value is None else limits.args_json(value)


def _metadata_json(value: Mapping[str, Any] | None) -> str:
    if value is None:
        return "{}"
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a JSON object, not {type(value).__name__}")
    return limits.args_json(dict(value))


def _checked(field: str, check: Any, value: Any) -> Any:
    try:
        return check(value)
    except ValueError as exc:
        raise InvalidJob(field, str(exc)) from None


def _page(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
