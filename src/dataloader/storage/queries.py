"""Every SQL statement dataloader runs, one named constant each.

Rules kept by all statements below:
* times come from the database clock (`now()`), never from the worker;
* every write after a claim is fenced on `status = 'running'` and the claim's `claim_token`
  (which every claim draws at random, migration 0006), so a worker whose lease was reaped,
  whose claim was handed back, or whose claim a failover lost, can never overwrite the job's
  new owner;
* a statement that finds its rows by primary key tests the status as `status::text`, and the
  lock_key probe as `(status = 'running') IS TRUE`: the spec's `ix_dl_jobs_status_queue` cannot
  serve either form, so stale statistics cannot make the planner read every running job
  instead (migration 0004 says more);
* a state change and its `dl_job_events` row are written by the same statement.
"""

from __future__ import annotations

import functools
from typing import Final

from dataloader.storage.statement import Statement

#: Channel of the spec's trigger: payload = queue name of a job that became ready.
JOBS_CHANNEL: Final = "dl_jobs"
#: Our channel for cancel requests of running jobs: payload = job_id.
CANCEL_CHANNEL: Final = "dl_jobs_cancel"

# --- producers ---------------------------------------------------------------------------------

#: Parking at insert. A job enqueued while a job of its lock_key runs would only be parked by
#: the first claim that walks it (PARK_JOBS): a long run of them costs claims that walk, lock
#: and write each. An insert that `park_behind_running` writes such a job parked behind the
#: running job at once. The running job's end looks for its key's next job in the snapshot
#: its statement began with, which holds no job inserted later; so inserts and ends meet on a
#: lock of the key (migration 0029): for each key of the insert that a running job holds in
#: its snapshot, dl_park_behind tries the lock shared (held exclusively: an end is under way,
#: and nothing is parked) and then looks, in a snapshot taken after it, whether a job of the
#: key still runs; the insert holds the lock until it commits. An end that frees a key and
#: does not hand off its next job takes the lock exclusively and looks again, in a snapshot
#: taken after it, for a job parked so, in each queue (dl_put_back_parked, migration 0030, from
#: _WAKE's `unseen` and SET_JOB_STATES's `again`). No row is locked: heartbeats never wait
#: for an insert. The caller asks for this only when the insert commits at once, is of at
#: most PARKING_BATCH_MAX jobs with ids of our making, and no job of it has an
#: idempotency_key: nothing keeps it waiting while it holds the lock, and an end of its keys
#: waits for it no longer than its statement.

#: Insert one job unless its idempotency_key exists; journal `queued` (with `actor` as `by`) in
#: the same statement. A job without a lock_key (NULL) is `lock_free`, stored with key ''.
#: Returns no row on an idempotency conflict (then read the existing job with JOBS_BY_IDEMPOTENCY).
#: `args` is JSON text: any asyncpg connection sends text, with or without a json codec.
#: `delay_sec` (with no `available_at`) counts from the database's clock, to the microsecond (a
#: float: cast, since the literal 0 beside it would make it an integer, a delay of 0.3 s none).
#: With `park_behind_running`, a job whose lock_key a running job holds goes in parked behind
#: it (see Parking at insert, above).
INSERT_JOB: Final = Statement("""
WITH parked_behind AS (
    SELECT true AS yes
    FROM (SELECT hashtext(r.lock_key) AS lock_hash FROM dl_jobs r
          WHERE :park_behind_running::bool AND :lock_key::text IS NOT NULL
            AND (r.status = 'running') IS TRUE AND NOT r.lock_free
            AND hashtext(r.lock_key) = hashtext(:lock_key::text)
          LIMIT 1) AS running
    WHERE dl_park_behind(running.lock_hash)
), ins AS (
    INSERT INTO dl_jobs (job_id, queue, task, args, idempotency_key, lock_key, lock_free,
                         partition_key, priority, available_at, max_attempts, lease_ttl_sec,
                         producer, consumer_group, parked)
    SELECT new.id, :queue, :task, :args::text::jsonb, :idempotency_key,
           COALESCE(:lock_key::text, ''), :lock_key::text IS NULL,
           :partition_key, :priority, due.at, :max_attempts, :lease_ttl_sec, :producer,
           :consumer_group,
           CASE WHEN due.at > now() THEN 'delayed'
                WHEN EXISTS (SELECT 1 FROM parked_behind) THEN 'lock_key' END
    FROM (SELECT :job_id::uuid AS id) AS new,
         (SELECT COALESCE(:available_at,
                          now() + make_interval(secs => COALESCE(:delay_sec::float8, 0))) AS at
         ) AS due
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, queue, status, available_at
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'queued',
           jsonb_build_object('available_at', available_at, 'by', :actor::text)
    FROM ins
)
SELECT job_id, status::text AS status FROM ins
""")

#: Insert many jobs in one statement (arrays, one element per job; `job_ids` chosen by the
#: caller so that results map back to inputs). Jobs whose idempotency_key exists are skipped,
#: and so are repeats of a key within the batch (its first occurrence is inserted); the
#: inserted ids come back. Journals `queued` for each inserted job (`actor` as `by`).
#: `delay_sec` is read by position, and may be empty when no job has a delay (it then costs
#: nothing per job). A job without a lock_key (NULL) is `lock_free`, stored with key ''.
#: With `park_behind_running`, a job whose lock_key a running job holds goes in parked behind
#: it (see Parking at insert, above; the running jobs of the batch's keys are found together).
INSERT_JOBS: Final = Statement("""
WITH parked_behind AS (
    SELECT running.lock_hash
    FROM (SELECT DISTINCT hashtext(r.lock_key) AS lock_hash FROM dl_jobs r
          WHERE :park_behind_running::bool
            AND (r.status = 'running') IS TRUE AND NOT r.lock_free
            AND hashtext(r.lock_key) IN (
                SELECT hashtext(k) FROM unnest(:lock_key::text[]) AS k WHERE k IS NOT NULL)
         ) AS running
    WHERE dl_park_behind(running.lock_hash)
), ins AS (
    INSERT INTO dl_jobs (job_id, queue, task, args, idempotency_key, lock_key, lock_free,
                         partition_key, priority, available_at, max_attempts, lease_ttl_sec,
                         producer, consumer_group, parked)
    SELECT t.job_id, t.queue, t.task, t.args::jsonb, t.idempotency_key,
           COALESCE(t.lock_key, ''), t.lock_key IS NULL, t.partition_key,
           t.priority, due.at, t.max_attempts, t.lease_ttl_sec, t.producer, t.consumer_group,
           CASE WHEN due.at > now() THEN 'delayed'
                WHEN t.lock_key IS NOT NULL
                     AND hashtext(t.lock_key) IN (SELECT lock_hash FROM parked_behind)
                    THEN 'lock_key' END
    FROM unnest(:job_ids::uuid[], :queue::text[], :task::text[], :args::text[],
                :idempotency_key::text[], :lock_key::text[], :partition_key::text[],
                :priority::int[], :available_at::timestamptz[], :max_attempts::int[],
                :lease_ttl_sec::int[], :producer::text[], :consumer_group::text[])
         WITH ORDINALITY
         AS t(job_id, queue, task, args, idempotency_key, lock_key, partition_key, priority,
              available_at, max_attempts, lease_ttl_sec, producer, consumer_group, n)
    CROSS JOIN LATERAL (
        SELECT COALESCE(t.available_at, now() + make_interval(
                   secs => COALESCE((:delay_sec::float8[])[t.n::int], 0))) AS at
    ) AS due
    -- one key order for every batch: no deadlock between batches; rows are inserted in this
    -- order, so of a key repeated in the batch the first occurrence is the one inserted
    ORDER BY t.idempotency_key, t.n
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, queue, available_at
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'queued',
           jsonb_build_object('available_at', available_at, 'by', :actor::text)
    FROM ins
)
SELECT job_id FROM ins
""")

#: The jobs holding some idempotency keys (their facts, for a re-run), and which fields of the
#: jobs asked for under those keys differ from theirs (arrays, one element per asked-for job).
#: "The same job" compares every field as it would be stored (a default is a value), except
#: that an omitted (NULL) available_at, producer or consumer_group is no difference; a given
#: available_at is compared with the one the job was queued with (its `queued` event), not with
#: today's, which retries and backoffs move. A delay is never a difference.
JOBS_BY_IDEMPOTENCY: Final = Statement("""
SELECT t.idempotency_key, j.job_id, j.status::text AS status, j.attempt, j.max_attempts,
       j.handbacks, j.cancel_requested, j.rerun_requested,
       array_remove(ARRAY[
           CASE WHEN j.queue <> t.queue THEN 'queue' END,
           CASE WHEN j.task <> t.task THEN 'task' END,
           CASE WHEN j.args <> t.args::jsonb THEN 'args' END,
           -- a job without a lock_key (NULL) is the same only as another without one
           CASE WHEN j.lock_free <> (t.lock_key IS NULL) OR j.lock_key <> t.lock_key
                THEN 'lock_key' END,
           CASE WHEN j.partition_key <> t.partition_key THEN 'partition_key' END,
           CASE WHEN j.priority <> t.priority THEN 'priority' END,
           CASE WHEN t.available_at <> (
                    SELECT (e.payload->>'available_at')::timestamptz FROM dl_job_events e
                    WHERE e.job_id = j.job_id AND e.kind = 'queued'
                    ORDER BY e.event_id LIMIT 1)
                THEN 'available_at' END,
           CASE WHEN j.max_attempts <> t.max_attempts THEN 'max_attempts' END,
           CASE WHEN j.lease_ttl_sec <> t.lease_ttl_sec THEN 'lease_ttl_sec' END,
           CASE WHEN j.producer IS DISTINCT FROM COALESCE(t.producer, j.producer)
                THEN 'producer' END,
           CASE WHEN j.consumer_group IS DISTINCT FROM COALESCE(t.consumer_group, j.consumer_group)
                THEN 'consumer_group' END
       ], NULL) AS differs
FROM unnest(:queue::text[], :task::text[], :args::text[], :idempotency_key::text[],
            :lock_key::text[], :partition_key::text[], :priority::int[],
            :available_at::timestamptz[], :max_attempts::int[], :lease_ttl_sec::int[],
            :producer::text[], :consumer_group::text[])
     AS t(queue, task, args, idempotency_key, lock_key, partition_key, priority, available_at,
          max_attempts, lease_ttl_sec, producer, consumer_group)
JOIN dl_jobs j ON j.idempotency_key = t.idempotency_key
""")

# --- readers -------------------------------------------------------------------------------

#: The job holding an idempotency key (its unique index).
JOB_BY_IDEMPOTENCY_KEY: Final = Statement("""
SELECT job_id FROM dl_jobs WHERE idempotency_key = :idempotency_key
""")

#: A job's args and partition_key (as JSON text), which readers of its state seldom need.
JOB_ARGS: Final = Statement("""
SELECT args::text AS args, partition_key FROM dl_jobs WHERE job_id = :job_id
""")

#: A job's columns as readers see it. JSON comes back as text, whatever codec the connection
#: has (the client may run on a pool or an engine that is not ours); a lock_free job's key
#: (stored as '') as NULL.
_JOB_COLUMNS: Final = """job_id, queue, task, status::text AS status, attempt,
       max_attempts, cancel_requested, created_at, available_at, started_at, finished_at,
       heartbeat_at, error,
       progress::text AS progress, CASE WHEN NOT lock_free THEN lock_key END AS lock_key,
       idempotency_key, priority, result::text AS result,
       duration_ms, worker_id, checkpoint::text AS checkpoint, rerun_requested, attempted_at"""

#: Jobs as readers see them, those `{where}` names.
_READ_JOBS: Final = """
SELECT {columns}
FROM dl_jobs WHERE {where}
"""

#: One job as readers see it.
JOB_STATUS: Final = Statement(_READ_JOBS.format(columns=_JOB_COLUMNS, where="job_id = :job_id"))

#: JOB_STATUS of several jobs at once (the dashboard's live views: one read for every job
#: someone watches).
JOB_STATUSES: Final = Statement(
    _READ_JOBS.format(columns=_JOB_COLUMNS, where="job_id = ANY(:job_ids::uuid[])")
)

#: The jobs the success of `:parent` enqueued as its stages (their idempotency_key names it:
#: `core.models.stage_key`), oldest first, `:limit` at most, from the stage index (0022).
STAGE_JOB_IDS: Final = Statement("""
SELECT job_id FROM dl_jobs
WHERE idempotency_key LIKE 'stage:%' AND substr(idempotency_key, 7, 36) = :parent::uuid::text
ORDER BY created_at, job_id
LIMIT :limit
""")

#: What a page of jobs filters on: each filter, by name, is a condition over parameters of
#: its own name. A statement holds only the conditions given (see `list_jobs`), so that the
#: planner sees them all and picks its index: `(:x IS NULL OR col = :x)` in a prepared
#: statement gets a generic plan that reads the whole table.
JOB_FILTERS: Final = {
    # the (status, queue) index answers a rare queue; the order's index a common one
    "queue": "queue = :queue AND status = ANY(enum_range(NULL::dl_status))",
    "status": "status = :status::dl_status",
    # with a status among these, the same status as a constant: it lets the planner prove, in
    # a generic plan too, that the index of tasks' failures (0024) holds every match
    "ended_badly": "status IN ('failed', 'lost', 'canceled')",
    "task": "task = :task",
    # a job without a lock_key (lock_free, stored with key '') has none to be found by
    "lock_key": "hashtext(lock_key) = hashtext(:lock_key) AND lock_key = :lock_key"
    " AND NOT lock_free",
    # a partition_key given (not ''): the partition_key index holds only those
    "partition_key": "hashtext(partition_key) = hashtext(:partition_key)"
    " AND partition_key = :partition_key AND partition_key <> ''",
    # jobs without a partition_key (the filter partition_key='')
    "no_partition_key": "partition_key = ''",
    "created_from": "created_at >= :created_from",
    "created_until": "created_at < :created_until",
    "finished_from": "finished_at >= :finished_from",
    # a job is created before it finishes (both are the database's now()): the bound on
    # created_at starts the walk of the order's index at the range, not at the newest job
    "finished_until": "finished_at < :finished_until AND created_at < :finished_until",
    # containment, answered by the args index (0021): it holds hashes of args' paths and
    # values, so no args is too large for it; it leaves out empty args, which a search (of
    # at least one key) never finds
    "args": "args @> :args::text::jsonb AND args <> '{}'::jsonb",
    # the keyset of the next page: the last job of the page before
    "after": "(created_at, job_id) < (:after_created, :after_id::uuid)",
}

_LIST_JOBS = """
SELECT {columns}
FROM dl_jobs
WHERE {part}
  AND {conditions}
ORDER BY {order}
LIMIT :limit"""

#: A page of the running jobs and the others together: the newest of each, merged.
_LIST_MERGED = """
SELECT * FROM (({others}) UNION ALL ({running})) AS page
ORDER BY created_at DESC, job_id DESC
LIMIT :limit"""

#: The two parts of the jobs a page reads, each through its own indexes: the list's indexes
#: leave out the running version of a job (0027); the running jobs, few, are found through an
#: index of running jobs (the second form is the condition of the running keys': see 0004).
_LIST_PARTS: Final = {
    False: "status <> 'running'",
    True: "status = 'running' AND (status = 'running') IS TRUE",
}


@functools.cache
def list_jobs(
    filters: frozenset[str], narrow: bool = False, running: bool | None = None
) -> Statement:
    """A page of jobs newest first, with the conditions of `filters` (names of JOB_FILTERS).
    The caller asks for one row more than it shows, to learn whether another page follows.
    `running`: the status asked for is running (True) or another (False); None (no status
    asked for): the newest of the running jobs and of the others, merged.
    `narrow`: the queue and status given match few jobs (STATUS_QUEUE_PROBE): they are read
    from the (status, queue) index and sorted, the order's index kept out of the planner's
    reach (it would walk the newest jobs of every queue looking for matches that may never
    come: 5.5 s beside 10,000,000 finished jobs for a queue without failed jobs)."""
    unknown = filters - JOB_FILTERS.keys()
    if unknown:
        raise ValueError(f"no such job filter: {sorted(unknown)}")
    conditions = [JOB_FILTERS[name] for name in JOB_FILTERS if name in filters] or ["true"]
    order = (
        "created_at + interval '0' DESC, job_id DESC" if narrow else "created_at DESC, job_id DESC"
    )
    part = {
        of_running: _LIST_JOBS.format(
            columns=_JOB_COLUMNS,
            part=_LIST_PARTS[of_running],
            conditions="\n  AND ".join(conditions),
            order=order,
        )
        for of_running in (False, True)
    }
    if running is not None:
        return Statement(part[running])
    return Statement(_LIST_MERGED.format(others=part[False], running=part[True]))


#: How many jobs of `:status` the queue `:queue` holds, counting no further than `:probe` (an
#: index-only range of the spec's (status, queue) index).
STATUS_QUEUE_PROBE: Final = Statement("""
SELECT count(*) FROM (
    SELECT 1 FROM dl_jobs WHERE status = :status::dl_status AND queue = :queue LIMIT :probe
) AS found
""")


#: What the client decides a cancel, a retry or a re-run on.
JOB_FACTS: Final = Statement("""
SELECT queue, task, status::text AS status, attempt, max_attempts, handbacks, cancel_requested,
       rerun_requested
FROM dl_jobs WHERE job_id = :job_id
""")

#: A job's journal, oldest first (payloads as JSON text): the entries after `:after` (an
#: event_id; 0: from the first), at most `:limit` of them (NULL: all).
JOB_EVENTS: Final = Statement("""
SELECT event_id, kind, ts, payload::text AS payload FROM dl_job_events
WHERE job_id = :job_id AND event_id > :after
ORDER BY event_id
LIMIT :limit
""")

#: Whether the database was ever migrated by dataloader (see APPLIED_MIGRATIONS).
MIGRATIONS_TABLE_PRESENT: Final = "SELECT to_regclass('dl_schema_migrations') IS NOT NULL"

#: Per-queue statistics (one row per queue holding jobs that are queued, running, failed or
#: lost; only `:queue` when given). Every count reads an index range of the jobs in that state
#: (the spec's `ix_dl_jobs_status_queue` past the finished ones, the parked indexes), and the
#: oldest due job is the first entry of the spec's claim index: nothing reads the finished
#: jobs, however many the table keeps. `queued` includes `delayed` and `waiting`.
QUEUE_STATS: Final = Statement("""
WITH by_status AS (
    SELECT queue, status, count(*) AS n FROM dl_jobs
    WHERE status IN ('queued', 'running', 'failed', 'lost')
      AND (queue = :queue::text OR :queue::text IS NULL)
    GROUP BY queue, status
)
SELECT b.queue,
       COALESCE(sum(b.n) FILTER (WHERE b.status = 'queued'), 0)::bigint AS queued,
       COALESCE(sum(b.n) FILTER (WHERE b.status = 'running'), 0)::bigint AS running,
       COALESCE(sum(b.n) FILTER (WHERE b.status = 'failed'), 0)::bigint AS failed,
       COALESCE(sum(b.n) FILTER (WHERE b.status = 'lost'), 0)::bigint AS lost,
       (SELECT count(*) FROM dl_jobs d
        WHERE d.status = 'queued' AND d.parked = 'delayed' AND d.queue = b.queue
          AND d.available_at > now()) AS delayed,
       (SELECT count(*) FROM dl_jobs w
        WHERE w.status = 'queued' AND w.parked = 'lock_key' AND w.queue = b.queue) AS waiting,
       (SELECT EXTRACT(EPOCH FROM now() - o.available_at)::float8 FROM dl_jobs o
        WHERE o.status = 'queued' AND o.queue = b.queue
          AND o.available_at <= now() AND isfinite(o.available_at)
        ORDER BY o.available_at LIMIT 1) AS oldest_age_sec
FROM by_status b
GROUP BY b.queue
ORDER BY b.queue
""")

#: The oldest transaction of this database still holding back the xmin horizon (vacuum cannot
#: remove rows that died after it started), other than our own session. No query text: it may
#: hold secrets.
OLDEST_TRANSACTION: Final = """
SELECT pid, state, application_name,
       EXTRACT(EPOCH FROM now() - xact_start)::float8 AS age_sec
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
ORDER BY xact_start
LIMIT 1
"""

#: Dead row versions in the queue table and its last vacuum.
QUEUE_TABLE_HEALTH: Final = """
SELECT n_dead_tup AS dead_tuples, n_live_tup AS live_tuples,
       GREATEST(last_vacuum, last_autovacuum) AS last_vacuum
FROM pg_stat_user_tables WHERE relid = 'dl_jobs'::regclass
"""

#: Waits caused by lock_key collisions under hashtext in the last hour (dl_wake_lock_waiter
#: journals them; a partial index keeps this cheap however long the journal).
RECENT_LOCK_COLLISIONS: Final = """
SELECT count(*) FROM dl_job_events
WHERE kind = 'lock_key_collision' AND ts > now() - interval '1 hour'
"""

# --- client requests -----------------------------------------------------------------------

#: A client's request on a job that keeps its status (see `core.transitions.Request`): set
#: `cancel_requested` or `rerun_requested`, and replace its args when given (a re-run's newest
#: version), fenced on the facts it was decided on; journals it, and wakes the worker running a
#: job whose cancel was requested. Returns no row when the job no longer matches.
REQUEST_ON_JOB: Final = Statement("""
WITH upd AS (
    UPDATE dl_jobs
    SET cancel_requested = cancel_requested OR :cancel,
        rerun_requested = rerun_requested OR :rerun,
        args = COALESCE(:args::text::jsonb, args),
        -- a queued job's newest version starts from the beginning (a running one's re-run
        -- clears it when the run ends)
        checkpoint = CASE WHEN :args::text IS NOT NULL AND status::text = 'queued' THEN NULL
                          ELSE checkpoint END
    WHERE job_id = :job_id AND status::text = :expect_status AND attempt = :expect_attempt
      AND cancel_requested = :expect_cancel AND rerun_requested = :expect_rerun
    RETURNING job_id, queue, attempt
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, :journal, jsonb_build_object('attempt', attempt, 'by', :actor::text)
    FROM upd
)
, woken AS (
    SELECT pg_notify('dl_jobs_cancel', job_id::text) FROM upd WHERE :cancel
)
SELECT (SELECT count(*) FROM upd) > 0 AS written, (SELECT count(*) FROM woken) AS woken
""")

# --- workers: claim ----------------------------------------------------------------------------

#: Claim up to `limit` ready jobs of `queue` (the spec's CTE, batched), at most one per lock_key
#: hash, from the first `walk` jobs of the claim's order (`walk` ≥ `limit`) that are not parked
#: (migration 0009): keys that collide under hashtext wait in claim order like jobs of one key.
#: The jobs claimed fill at most `slots` of the worker's slots: a job fills one, except that up
#: to `batch_size` jobs of one batched task (`batched_tasks`, each with its size at the same
#: place of `batch_sizes`) fill one together.
#: Nothing is claimed from a paused queue (`dl_queues`, migration 0013), nor from one with
#: limits (migration 0015): those are claimed by CLAIM_LIMITED, which the last row points to.
#: Each claim increments `claim_seq` and takes a new `claim_token`, the fence of every later
#: write: the md5 of a random UUID the worker draws for the claim (`claim_seed`) and the row's
#: number in the batch, unique for every claim on any server (PostgreSQL's gen_random_uuid()
#: cost ~13 µs a row here, a tenth of a claim of ten), and which the worker can compute for
#: every row the claim could take (RECOVER_CLAIMS). Records the worker and journals `picked`.
#: The checkpoint comes back as JSON text, whatever codec the connection has. One more row
#: (`job_id` NULL) ends the answer: the jobs walked that cannot run now (not due, or their
#: lock_key's job running) in `blocked`, for PARK_JOBS; how many jobs the claim walked
#: (`walked` below `walk`: none is left to claim behind them); and in how many seconds the
#: queue's earliest delayed job is due (`next_due_in`, NULL if none: the claim loop's timer,
#: and at most 0 when one is due now and waits to be put back by PUT_BACK_DUE).
_CLAIM = """
WITH walked AS (
    SELECT j.job_id, CASE WHEN NOT j.lock_free THEN hashtext(j.lock_key) END AS lock_hash,
           j.lock_free, j.priority, j.created_at, j.available_at, j.available_at > now() AS not_due,
           j.partition_key, j.task
    FROM dl_jobs j
    WHERE j.status = 'queued' AND j.queue = :queue AND j.parked IS NULL
      -- tested once per claim (one probe of dl_queues)
      AND NOT (SELECT EXISTS (SELECT 1 FROM dl_queues p WHERE p.queue = :queue AND ({closed})))
      {walk_filter}
    ORDER BY j.priority ASC, j.created_at ASC, j.job_id ASC
    LIMIT :walk
    FOR UPDATE SKIP LOCKED
), judged AS (
    -- A per-row probe of ix_dl_jobs_running_lock_hash, but for a lock_free job (which no key
    -- holds back). Wrapped in a scalar subquery on purpose: a bare EXISTS becomes a join that
    -- may scan every running job.
    SELECT w.*, w.not_due OR CASE WHEN w.lock_free THEN false ELSE (SELECT EXISTS (
               SELECT 1 FROM dl_jobs r
               WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = w.lock_hash
                 AND NOT r.lock_free))
               END AS blocked
    FROM walked w
){limited_ctes}, slotted AS (
    -- whether each candidate takes a slot of its own: a one-job task's job does, and so does
    -- the first of every `batch_size` jobs of a batched task (the others join its batch), in
    -- claim order, as the worker groups them
    SELECT c.job_id, c.priority, c.created_at,
           (row_number() OVER (PARTITION BY c.task ORDER BY c.priority, c.created_at, c.job_id)
            - 1) % COALESCE((:batch_sizes::int[])[array_position(:batched_tasks::text[], c.task)],
                            1) = 0 AS opens_slot
    FROM ({candidates}) AS c
), picked AS (
    -- the candidates in claim order up to the last that fits in the worker's free slots
    -- (`slots`): a job claimed is a job that starts, none comes back for want of a slot
    SELECT job_id, priority, created_at,
           row_number() OVER (ORDER BY priority, created_at, job_id) AS n
    FROM (SELECT s.*,
                 count(*) FILTER (WHERE s.opens_slot) OVER (
                     ORDER BY s.priority, s.created_at, s.job_id ROWS UNBOUNDED PRECEDING) AS slot
          FROM slotted s) AS fitted
    WHERE fitted.slot <= :slots
    ORDER BY priority, created_at, job_id
    LIMIT {limit}
), claimed AS (
    UPDATE dl_jobs j
    SET status = 'running',
        started_at = COALESCE(j.started_at, now()),
        -- a new attempt: its start, and no error or duration of the one before (the journal
        -- keeps those)
        attempted_at = now(),
        error = NULL,
        duration_ms = NULL,
        attempt = j.attempt + 1,
        claim_seq = j.claim_seq + 1,
        claim_token = md5(:claim_seed::uuid::text || '/' || picked.n)::uuid,
        worker_id = :worker_id,
        lease_expires_at = now() + make_interval(secs => j.lease_ttl_sec),
        heartbeat_at = now()
    FROM picked
    WHERE j.job_id = picked.job_id
    RETURNING j.job_id, j.queue, j.task, j.args,
              -- a lock_free job has no key to lock (NULL for both)
              CASE WHEN NOT j.lock_free THEN j.lock_key END AS lock_key,
              CASE WHEN NOT j.lock_free THEN hashtext(j.lock_key) END AS lock_hash,
              j.partition_key, j.priority, j.created_at, j.attempt, j.max_attempts,
              j.lease_ttl_sec, j.cancel_requested, j.claim_seq, j.claim_token, j.handbacks,
              j.rerun_requested, j.checkpoint::text AS checkpoint,
              -- how long it waited once due (metrics)
              EXTRACT(EPOCH FROM now() - GREATEST(j.available_at, j.created_at))::float8
                  AS waited_sec
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'picked',
           jsonb_build_object('attempt', attempt, 'worker', :worker_id::text)
    FROM claimed
){spend}
SELECT c.*, NULL::uuid[] AS blocked, NULL::bigint AS walked, NULL::float8 AS next_due_in,
       NULL::bool AS limited, NULL::bigint AS held
FROM claimed c
UNION ALL
-- the last row: what the claim walked past, how far it walked, in how many seconds the
-- queue's earliest delayed job is due (at most 0: one is due now and waits to be put back) or
-- its rate lets the next job start, whether the queue has limits (its claims take
-- CLAIM_LIMITED's way), and how many jobs that could run its limits held back
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, array_agg(job_id) FILTER (WHERE blocked), count(*),
       LEAST(EXTRACT(EPOCH FROM LEAST(
                 (SELECT min(d.available_at) FROM dl_jobs d
                  WHERE d.status = 'queued' AND d.queue = :queue AND d.parked = 'delayed'),
                 min(available_at) FILTER (WHERE not_due)) - now())::float8,
             {token_wait}),
       COALESCE((SELECT {has_limits} FROM dl_queues p WHERE p.queue = :queue), false),
       {held}
FROM judged
ORDER BY priority, created_at, job_id
"""

#: Whether a dl_queues row `p` sets any limit.
_HAS_LIMITS = (
    "(p.max_running IS NOT NULL OR p.max_running_per_partition IS NOT NULL"
    " OR p.max_per_second IS NOT NULL)"
)

#: The one of each lock_key hash (the first in claim order) of the jobs that can run, and every
#: lock_free one (no hash: each is its own).
_ONE_PER_KEY = """
        SELECT DISTINCT ON (lock_hash, CASE WHEN lock_free THEN job_id END)
               job_id, priority, created_at, task
        FROM judged
        WHERE NOT blocked
        ORDER BY lock_hash, CASE WHEN lock_free THEN job_id END, priority, created_at, job_id"""

CLAIM_JOBS: Final = Statement(
    _CLAIM.format(
        closed=f"p.paused OR {_HAS_LIMITS}",
        limited_ctes="",
        candidates=_ONE_PER_KEY,
        limit=":limit",
        spend="",
        token_wait="NULL::float8",
        has_limits=_HAS_LIMITS,
        walk_filter="",
        held="0::bigint",
    )
)

#: CLAIM_JOBS for a queue with limits (migration 0015), run in a transaction after
#: LOCK_QUEUE_CLAIMS: the claims of all replicas count and claim one after another. It claims
#: no more than leaves the queue's running jobs within `max_running`, no job of a partition_key
#: that has `max_running_per_partition` running already (nor more than fit; jobs without a
#: partition_key are in no partition), and no more than
#: the queue's token bucket holds (`max_per_second`, refilled continuously up to one second's
#: worth), which it spends. The last row says whether the queue still has limits.
CLAIM_LIMITED: Final = Statement(
    _CLAIM.format(
        closed="p.paused",
        limited_ctes="""
, settings AS (
    SELECT p.max_running, p.max_running_per_partition, p.max_per_second,
           -- the clock as it is now, not at the transaction's start: the claims take turns
           -- (NULL without a rate: no bucket)
           CASE WHEN p.max_per_second IS NOT NULL THEN
               LEAST(GREATEST(p.max_per_second, 1),
                     COALESCE(p.tokens + p.max_per_second
                                         * EXTRACT(EPOCH FROM clock_timestamp() - p.tokens_at),
                              GREATEST(p.max_per_second, 1)))
           END AS tokens
    FROM dl_queues p WHERE p.queue = :queue
), room AS (
    SELECT GREATEST(0, LEAST(
               :limit,
               COALESCE(s.max_running - (SELECT count(*) FROM dl_jobs r
                                         WHERE r.status = 'running' AND r.queue = :queue),
                        :limit),
               COALESCE(floor(s.tokens)::int, :limit))) AS n,
           s.max_running_per_partition AS per_partition
    FROM settings s
), ranked AS (
    SELECT o.*,
           CASE WHEN o.partition_key <> '' THEN
               row_number() OVER (PARTITION BY o.partition_key
                                  ORDER BY o.priority, o.created_at, o.job_id)
               -- the jobs of its partition_key running now, found by the key's hash
               -- (ix_dl_jobs_running_partition_hash), the text itself tested on them
               + (SELECT count(*) FROM dl_jobs r
                  WHERE r.status = 'running' AND r.queue = :queue AND r.partition_key <> ''
                    AND hashtext(r.partition_key) = hashtext(o.partition_key)
                    AND r.partition_key = o.partition_key)
           END AS partition_nth
    FROM (
        SELECT DISTINCT ON (lock_hash, CASE WHEN lock_free THEN job_id END)
               job_id, priority, created_at, partition_key, task
        FROM judged
        WHERE NOT blocked
        ORDER BY lock_hash, CASE WHEN lock_free THEN job_id END, priority, created_at, job_id
    ) AS o
)""",
        candidates="""
        SELECT r.job_id, r.priority, r.created_at, r.task FROM ranked r
        -- jobs without a partition_key ('', partition_nth NULL) are in no partition: only
        -- max_running holds them
        WHERE r.partition_nth IS NULL
           OR r.partition_nth <= COALESCE((SELECT per_partition FROM room), r.partition_nth)""",
        limit="COALESCE((SELECT n FROM room), :limit)",
        spend=""", spent AS (
    UPDATE dl_queues p
    SET tokens = s.tokens - (SELECT count(*) FROM claimed), tokens_at = clock_timestamp()
    FROM settings s
    WHERE p.queue = :queue AND p.max_per_second IS NOT NULL
)""",
        # when the bucket holds less than a job: in how long it will hold one
        token_wait="""(SELECT (1 - (s.tokens - (SELECT count(*) FROM claimed))) / s.max_per_second
              FROM settings s
              WHERE s.max_per_second IS NOT NULL
                AND s.tokens - (SELECT count(*) FROM claimed) < 1)""",
        has_limits=_HAS_LIMITS,
        # the jobs of a partition_key that has its most running already are not walked: a
        # backlog of one partition would otherwise fill every walk, and the jobs of the
        # others behind it would wait for it to drain (ix_dl_jobs_running_partition_hash, a
        # probe per job walked, only with a per-partition limit)
        walk_filter="""AND CASE WHEN j.partition_key = '' THEN true
               WHEN (SELECT p.max_running_per_partition FROM dl_queues p
                     WHERE p.queue = :queue) IS NULL THEN true
               ELSE (SELECT count(*) FROM dl_jobs r
                     WHERE r.status = 'running' AND r.queue = :queue AND r.partition_key <> ''
                       AND hashtext(r.partition_key) = hashtext(j.partition_key)
                       AND r.partition_key = j.partition_key)
                    < (SELECT p.max_running_per_partition FROM dl_queues p WHERE p.queue = :queue)
          END""",
        held="(SELECT count(*) FROM ranked) - (SELECT count(*) FROM claimed)",
    )
)

#: Serialises the claims of a queue with limits across every replica, until the claiming
#: transaction ends (a class of dataloader's own two-key locks apart from MIGRATION_LOCK's).
LOCK_QUEUE_CLAIMS: Final = Statement("SELECT pg_advisory_xact_lock(1684828012, hashtext(:queue))")

#: The jobs a claiming write whose answer was lost claimed for `worker_id` (it may have
#: committed: CLAIM_JOBS, CLAIM_LIMITED, or HAND_OFF_NEXT): those running with
#: one of the tokens it could have given, the md5 of its `claim_seed` and a `suffix` (a claim's
#: row numbers, a hand-off's finished job ids). Nothing else knows these tokens: a job found is
#: this worker's, and only it can run it or hand it back. Reads one of the partial indexes that
#: only running jobs enter (a rare statement: no index of its own to keep up on every claim).
#: The columns are CLAIM_JOBS's (no wait measured).
RECOVER_CLAIMS: Final = Statement("""
SELECT j.job_id, j.queue, j.task, j.args,
       CASE WHEN NOT j.lock_free THEN j.lock_key END AS lock_key,
       CASE WHEN NOT j.lock_free THEN hashtext(j.lock_key) END AS lock_hash,
       j.partition_key, j.priority, j.created_at, j.attempt, j.max_attempts, j.lease_ttl_sec,
       j.cancel_requested, j.claim_seq, j.claim_token, j.handbacks, j.rerun_requested,
       j.checkpoint::text AS checkpoint, NULL::float8 AS waited_sec
FROM dl_jobs j
WHERE j.status = 'running' AND j.worker_id = :worker_id
  AND j.claim_token = ANY(ARRAY(SELECT md5(:claim_seed::uuid::text || '/' || s.suffix)::uuid
                                FROM unnest(:suffixes::text[]) AS s(suffix)))
""")

#: Park the jobs a claim walked past (`job_ids`) that still cannot run: one not due yet is
#: parked `delayed`; one whose lock_key hash is running is parked `lock_key`, but only if its
#: running job could be share-locked (`FOR SHARE SKIP LOCKED` reads it as it is now): a job
#: leaving `running` meanwhile may already have looked for the next job of its key to put
#: back (WAKE_LOCK_WAITERS), and that job must not be parked after it looked (while the share
#: lock is held, that job's end skips its row and is written again later, when it sees what
#: this statement parked). The other queued jobs of such a busy hash are parked with them, up to
#: `siblings` per hash (by ix_dl_jobs_queued_lock_hash): a long run of jobs of one running key
#: is parked without claims walking, and locking, each of them first. Returns how many were
#: parked.
PARK_JOBS: Final = Statement("""
WITH walked AS (
    SELECT j.job_id, hashtext(j.lock_key) AS lock_hash, j.lock_free,
           j.available_at > now() AS not_due
    FROM dl_jobs j
    WHERE j.job_id = ANY(:job_ids::uuid[]) AND j.status = 'queued' AND j.parked IS NULL
    FOR UPDATE SKIP LOCKED
), busy_keys AS (
    SELECT g.lock_hash
    FROM (SELECT DISTINCT lock_hash FROM walked WHERE NOT not_due AND NOT lock_free) AS g
    CROSS JOIN LATERAL (
        SELECT 1 FROM dl_jobs r
        WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = g.lock_hash
          AND NOT r.lock_free
        LIMIT 1
        FOR SHARE OF r SKIP LOCKED
    ) AS held
), siblings AS (
    SELECT s.job_id
    FROM busy_keys b
    CROSS JOIN LATERAL (
        SELECT q.job_id FROM dl_jobs q
        WHERE q.status = 'queued' AND hashtext(q.lock_key) = b.lock_hash AND q.parked IS NULL
          AND NOT q.lock_free
          AND (q.available_at <= now()) IS TRUE  -- one not due is parked `delayed` when walked
        LIMIT :siblings
        FOR UPDATE OF q SKIP LOCKED
    ) AS s
), chosen AS (
    SELECT job_id, CASE WHEN not_due THEN 'delayed' ELSE 'lock_key' END AS why FROM walked
    WHERE not_due OR (NOT lock_free AND lock_hash IN (SELECT lock_hash FROM busy_keys))
    UNION
    SELECT job_id, 'lock_key' FROM siblings
), parked AS (
    UPDATE dl_jobs j SET parked = c.why
    FROM chosen c
    WHERE j.job_id = c.job_id
    RETURNING j.job_id
)
SELECT count(*) FROM parked
""")

#: Put back (into the claim's order) up to `limit` delayed jobs of `queue` that have come due,
#: say in how many seconds the next one comes due (NULL: none is parked delayed), and whether
#: due ones were left parked (`held`: another session held them, or the limit was reached;
#: the statement's snapshot still shows those it put back parked, so they are left out).
PUT_BACK_DUE: Final = Statement("""
WITH due AS (
    UPDATE dl_jobs j SET parked = NULL
    WHERE j.job_id IN (
        SELECT d.job_id FROM dl_jobs d
        WHERE d.status = 'queued' AND d.queue = :queue AND d.parked = 'delayed'
          AND d.available_at <= now()
        ORDER BY d.available_at
        LIMIT :limit
        FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING j.job_id
)
SELECT (SELECT count(*) FROM due) AS put_back,
       (SELECT EXTRACT(EPOCH FROM min(d.available_at) - now())::float8 FROM dl_jobs d
        WHERE d.status = 'queued' AND d.queue = :queue AND d.parked = 'delayed'
          AND d.available_at > now()) AS next_due_in,
       (SELECT EXISTS (SELECT 1 FROM dl_jobs d
                       WHERE d.status = 'queued' AND d.queue = :queue AND d.parked = 'delayed'
                         AND d.available_at <= now()
                         AND d.job_id NOT IN (SELECT job_id FROM due))) AS held
""")

#: Put back (into the claim's order) the first job, in claim order, parked behind each lock_key
#: hash in each queue where it has none ready, while no job of the hash runs: the end of a
#: running job puts back its key's parked jobs itself (the first of each queue), so this only
#: finds what was changed by hand (a running job deleted, a status set in SQL), or a parked job
#: another session held as an end looked. A job of the hash ready in another queue holds none
#: of this one's back: that queue may be paused, or served by nobody. The (hash, queue) pairs
#: are read by a skip scan of ix_dl_jobs_parked_lock_hash (0030), at most `limit` of them per
#: call. Wakes each queue concerned; returns the jobs put back.
PUT_BACK_STRANDED: Final = Statement("""
WITH RECURSIVE pairs AS (
    (SELECT hashtext(lock_key) AS h, queue AS q FROM dl_jobs
     WHERE status = 'queued' AND parked = 'lock_key'
     ORDER BY 1, 2 LIMIT 1)
    UNION ALL
    SELECT n.h, n.q FROM pairs CROSS JOIN LATERAL (
        SELECT hashtext(j.lock_key) AS h, j.queue AS q FROM dl_jobs j
        WHERE j.status = 'queued' AND j.parked = 'lock_key'
          AND (hashtext(j.lock_key), j.queue) > (pairs.h, pairs.q)
        ORDER BY 1, 2 LIMIT 1
    ) AS n
), stranded AS (
    SELECT pairs.h, pairs.q FROM pairs
    WHERE NOT (SELECT EXISTS (
          SELECT 1 FROM dl_jobs r
          WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = pairs.h
            AND NOT r.lock_free))
      AND NOT (SELECT EXISTS (  -- nor any ready to run in this queue
          SELECT 1 FROM dl_jobs q
          WHERE q.status = 'queued' AND hashtext(q.lock_key) = pairs.h AND q.queue = pairs.q
            AND q.parked IS NULL AND NOT q.lock_free))
    LIMIT :limit
), first_parked AS (
    SELECT (SELECT p.job_id FROM dl_jobs p
            WHERE p.status = 'queued' AND p.parked = 'lock_key'
              AND hashtext(p.lock_key) = stranded.h AND p.queue = stranded.q
            ORDER BY hashtext(p.lock_key), p.queue, p.priority, p.created_at, p.job_id
            LIMIT 1) AS job_id
    FROM stranded
), put_back AS (
    UPDATE dl_jobs j SET parked = NULL
    FROM first_parked f
    WHERE j.job_id = f.job_id AND j.status = 'queued' AND j.parked = 'lock_key'
    RETURNING j.job_id, j.queue
)
SELECT job_id, pg_notify('dl_jobs', queue) IS NULL AS woken FROM put_back
""")

#: Seconds until the earliest delayed job of `queue` becomes due (NULL: none).
#: Who holds the lock_key of a claimed job (`job_id`) that could not take it: `none` (the
#: holder ended meanwhile), `running job` (a running job of the same hash: claims skip the key
#: while it runs, and its end wakes the waiters), or `outside dataloader` (another service
#: sharing the lock space: the job waits the backoff delay). No row: the job is not ours.
LOCK_KEY_HOLDER: Final = Statement("""
SELECT CASE
    WHEN pg_try_advisory_xact_lock(hashtext(j.lock_key)) THEN 'none'
    WHEN EXISTS (SELECT 1 FROM dl_jobs r
                 WHERE (r.status = 'running') IS TRUE
                   AND hashtext(r.lock_key) = hashtext(j.lock_key) AND r.job_id <> j.job_id
                   AND NOT r.lock_free)
        THEN 'running job'
    ELSE 'outside dataloader' END AS holder
FROM dl_jobs j
WHERE j.job_id = :job_id AND j.status::text = 'running' AND j.claim_token = :claim_token
""")

# --- workers: while running --------------------------------------------------------------------

#: Extend the leases of many running jobs at once (`job_ids`, `claim_tokens`); journal a
#: `heartbeat` for those flagged in `journal` (throttled by the caller). Returns the jobs still
#: ours, whether their cancel was requested, and whether their lease was extended. Rows locked by
#: someone else (a pipeline fencing its own writes with FOR SHARE, an operator) are skipped, not
#: waited for: one locked row must not hold up every other lease of the process. Such a job is
#: still ours (it is reported with `extended` false) and is extended at a later beat. A job
#: missing from the answer is no longer ours. FOR NO KEY UPDATE, like the UPDATE itself, does
#: not conflict with the key-share locks of journal inserts.
HEARTBEAT_JOBS: Final = Statement("""
WITH mine AS (
    SELECT j.job_id, t.journal FROM dl_jobs j
    JOIN unnest(:job_ids::uuid[], :claim_tokens::uuid[], :journal::bool[])
         AS t(job_id, claim_token, journal)
      ON j.job_id = t.job_id AND j.claim_token = t.claim_token
    WHERE j.status::text = 'running'
    FOR NO KEY UPDATE OF j SKIP LOCKED
), beat AS (
    UPDATE dl_jobs j
    SET heartbeat_at = now(),
        lease_expires_at = now() + make_interval(secs => j.lease_ttl_sec)
    FROM mine WHERE j.job_id = mine.job_id
    RETURNING j.job_id, j.queue, j.attempt, j.cancel_requested, mine.journal
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'heartbeat',
           jsonb_build_object('attempt', attempt, 'worker', :worker_id::text)
    FROM beat WHERE journal
)
SELECT job_id, cancel_requested, true AS extended FROM beat
UNION ALL
SELECT j.job_id, j.cancel_requested, false AS extended FROM dl_jobs j
JOIN unnest(:job_ids::uuid[], :claim_tokens::uuid[]) AS t(job_id, claim_token)
  ON j.job_id = t.job_id AND j.claim_token = t.claim_token
WHERE j.status::text = 'running' AND j.job_id NOT IN (SELECT job_id FROM mine)
""")

#: Store a running job's progress (JSON text). Returns cancel_requested, or no row if the job is
#: not ours.
SET_PROGRESS: Final = Statement("""
UPDATE dl_jobs SET progress = :progress::text::jsonb
WHERE job_id = :job_id AND status::text = 'running' AND claim_token = :claim_token
RETURNING cancel_requested
""")

#: Store a running job's checkpoint (JSON text), fenced like progress: the next attempt resumes
#: from it. Returns cancel_requested, or no row if the job is not ours.
SET_CHECKPOINT: Final = Statement("""
UPDATE dl_jobs SET checkpoint = :checkpoint::text::jsonb
WHERE job_id = :job_id AND status::text = 'running' AND claim_token = :claim_token
RETURNING cancel_requested
""")

# --- transitions --------------------------------------------------------------------------

#: Set the states of jobs as decided (dataloader.core.transitions), each with its journal row.
#: A job is written only if its row still matches the facts the transition was decided on: its
#: status (`expect_status`), the claim that decided it (`expect_tokens`, NULL for a client's
#: move of a job nobody runs), its attempt and flags, and for the reaper (`expect_expired`) a
#: lease still expired (a heartbeat may have extended it since it was read). Each job comes back
#: as
#: * `written`, with its queue, lock_key, the status it left and the one it took, and whether a
#:   job waits for the lock_key it frees (`waiter`: WAKE_LOCK_WAITERS and HAND_OFF_NEXT, run
#:   after this in the same transaction, have work only then);
#: * `changed`: the identity holds but the attempt or a flag differs (a cancel or re-run was
#:   requested meanwhile): its facts come back, to decide again;
#: * `busy`: someone else holds the row (a pipeline fencing its writes with FOR SHARE): it is
#:   skipped, not waited for, so one locked row cannot hold up the batch;
#: a job missing from the answer no longer matches (it is not ours any more).
#: Ended jobs are announced to the clients waiting for them, and a job leaving `running` in a
#: queue whose running jobs are limited wakes that queue's claims.
#: The journal entry records the attempt that ended, `actor_role: actor` and the transition's
#: detail (JSON text).
#: What varies per job (id, claim token, result, duration) comes one element per job; the rest
#: comes once per distinct *shape* (`kinds` names each job's), one array per column, since the
#: outcomes of a batch mostly share one and asyncpg's encoding of every array element is most
#: of the cost of a batch on the worker's side. `set_cancel` and `set_rerun` are NULL where the
#: transition keeps the flag. (`_SET_STATES`: its common table expressions, FINISH_JOBS's
#: first ones too.)
_SET_STATES = """
WITH u AS (
    SELECT u.job_id, u.expect_token, u.result, u.duration_ms, u.kind
    FROM unnest(:job_ids::uuid[], :expect_tokens::uuid[], :kinds::int[], :results::text[],
                :durations::bigint[]) AS u(job_id, expect_token, kind, result, duration_ms)
), t AS (
    -- each job's shape, by subscript (a join would let the number of shapes sway the plan)
    SELECT u.job_id, u.expect_token, u.result, u.duration_ms,
           (:expect_status::text[])[u.kind] AS expect_status,
           (:expect_attempt::int[])[u.kind] AS expect_attempt,
           (:expect_cancel::bool[])[u.kind] AS expect_cancel,
           (:expect_rerun::bool[])[u.kind] AS expect_rerun,
           (:expect_expired::bool[])[u.kind] AS expect_expired,
           (:status::text[])[u.kind] AS status,
           (:attempt::int[])[u.kind] AS attempt,
           (:handbacks::int[])[u.kind] AS handbacks,
           (:retry_in::float8[])[u.kind] AS retry_in,
           (:error::text[])[u.kind] AS error,
           (:args::text[])[u.kind] AS args,
           (:journal::text[])[u.kind] AS journal,
           (:detail::text[])[u.kind] AS detail,
           (:finished::bool[])[u.kind] AS finished,
           (:set_error::bool[])[u.kind] AS set_error,
           (:set_result::bool[])[u.kind] AS set_result,
           (:set_duration::bool[])[u.kind] AS set_duration,
           (:clear_start::bool[])[u.kind] AS clear_start,
           (:clear_checkpoint::bool[])[u.kind] AS clear_checkpoint,
           (:set_cancel::bool[])[u.kind] AS set_cancel,
           (:set_rerun::bool[])[u.kind] AS set_rerun
    FROM u
), ident AS (
    -- `expect_expired` (the reaper's fence): the lease expired, or the owner is gone (its
    -- presence lapsed: EXPIRED_JOBS), still, as the job is written. Read only for the jobs
    -- `mine` did not lock (the answer's `busy`: the id is t's, so that this test is made
    -- before the row is looked up, not after)
    SELECT t.job_id FROM dl_jobs j JOIN t ON j.job_id = t.job_id
    WHERE j.job_id = ANY(:job_ids::uuid[])  -- by the primary key (see `mine`)
      AND j.status::text = t.expect_status
      AND (t.expect_token IS NULL OR j.claim_token = t.expect_token)
      AND (NOT t.expect_expired OR j.lease_expires_at < now()
           OR EXISTS (SELECT 1 FROM dl_workers w
                      WHERE w.worker_id = j.worker_id
                        AND w.seen_at < now() - make_interval(secs => 3 * w.period_sec)))
), mine AS (
    -- the same test again under the row lock (a row changed since the snapshot is tested, and
    -- read, as it is now); a row this skips was locked by someone else, or stopped matching
    -- meanwhile. Whether the row's attempt and flags still match is `fenced`; they come back
    -- for a job to be decided again when they do not.
    SELECT t.*, j.status::text AS row_status, j.attempt AS row_attempt, j.max_attempts,
           j.handbacks AS row_handbacks, j.cancel_requested AS row_cancel,
           j.rerun_requested AS row_rerun,
           j.attempt = t.expect_attempt AND j.cancel_requested = t.expect_cancel
               AND j.rerun_requested = t.expect_rerun AS fenced
    FROM dl_jobs j JOIN t ON j.job_id = t.job_id
    -- by the primary key, whatever the planner guesses of the arrays' length or of a table
    -- analyzed while it was small: a generic plan of the join alone hashed every job
    WHERE j.job_id = ANY(:job_ids::uuid[])
      AND j.status::text = t.expect_status
      AND (t.expect_token IS NULL OR j.claim_token = t.expect_token)
      AND (NOT t.expect_expired OR j.lease_expires_at < now()
           OR EXISTS (SELECT 1 FROM dl_workers w
                      WHERE w.worker_id = j.worker_id
                        AND w.seen_at < now() - make_interval(secs => 3 * w.period_sec)))
    FOR NO KEY UPDATE OF j SKIP LOCKED
), upd AS (
    -- the rows `mine` locked: nobody can have changed them since
    UPDATE dl_jobs j
    SET status = m.status::dl_status,
        attempt = m.attempt,
        handbacks = m.handbacks,
        available_at = COALESCE(now() + make_interval(secs => m.retry_in), j.available_at),
        lease_expires_at = NULL,
        finished_at = CASE WHEN m.finished THEN now() END,
        error = CASE WHEN m.set_error THEN m.error ELSE j.error END,
        result = CASE WHEN m.set_result THEN m.result::jsonb ELSE j.result END,
        duration_ms = CASE WHEN m.set_duration THEN m.duration_ms ELSE j.duration_ms END,
        started_at = CASE WHEN m.clear_start THEN NULL ELSE j.started_at END,
        attempted_at = CASE WHEN m.clear_start THEN NULL ELSE j.attempted_at END,
        heartbeat_at = CASE WHEN m.clear_start THEN NULL ELSE j.heartbeat_at END,
        cancel_requested = COALESCE(m.set_cancel, j.cancel_requested),
        rerun_requested = COALESCE(m.set_rerun, j.rerun_requested),
        checkpoint = CASE WHEN m.clear_checkpoint THEN NULL ELSE j.checkpoint END,
        args = COALESCE(m.args::jsonb, j.args),
        parked = CASE WHEN m.status = 'queued'
                       AND COALESCE(now() + make_interval(secs => m.retry_in), j.available_at)
                           > now()
                      THEN 'delayed' END
    FROM mine m
    WHERE j.job_id = m.job_id AND m.fenced
    RETURNING j.job_id, j.queue, j.lock_key, j.lock_free, j.available_at, j.status,
              m.expect_status, m.expect_attempt, m.journal, m.detail
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, journal,
           CASE WHEN detail IS NULL AND status <> 'queued'
                THEN jsonb_build_object('attempt', expect_attempt, :actor_role::text, :actor::text)
                ELSE jsonb_build_object('attempt', expect_attempt, :actor_role::text, :actor::text)
                     || COALESCE(detail::jsonb, '{}'::jsonb)
                     || CASE WHEN status = 'queued'
                             THEN jsonb_build_object('retry_at', available_at)
                             ELSE '{}'::jsonb END
           END
    FROM upd
), listened AS (
    -- whether a client listens for ended jobs: each listening session holds this key
    -- shared (LISTENER_LOCK), so this exclusive try fails. Taken, it is held until commit:
    -- a client starting to listen meanwhile reads its jobs only once these are written.
    SELECT NOT pg_try_advisory_xact_lock(1684828011, 2) AS anyone
), announced AS (
    -- whoever waits for these jobs (Client.wait) learns that they ended: one notification per
    -- 200 jobs (a payload holds at most 8,000 bytes), sent at commit, and only when a client
    -- listens (the server wakes every listening session of the database, workers' included,
    -- for each notification, whatever its channel)
    SELECT pg_notify('dl_job_finished', string_agg(job_id::text, ','))
    FROM (SELECT job_id, (row_number() OVER ()) / 200 AS chunk FROM upd
          WHERE status IN ('succeeded', 'failed', 'canceled', 'lost')) AS ended,
         listened
    WHERE listened.anyone
    GROUP BY chunk
), room_freed AS (
    -- a job leaving `running` in a queue whose running jobs are limited makes room: the
    -- workers of every replica that serve it claim again (their claims held jobs back and
    -- wait for this, not for their poll)
    SELECT pg_notify('dl_jobs', f.queue)
    FROM (SELECT DISTINCT u.queue FROM upd u
          WHERE u.expect_status = 'running' AND u.status::text <> 'running') AS f
    WHERE EXISTS (SELECT 1 FROM dl_queues p
                  WHERE p.queue = f.queue AND (p.max_running IS NOT NULL
                                               OR p.max_running_per_partition IS NOT NULL))
)"""

SET_JOB_STATES: Final = Statement(
    "".join(
        (
            _SET_STATES,
            """
, waiting AS (
    -- whether a due job waits for the lock_key hash each job written frees: a job leaving
    -- `running`, or a queued job ending (it may have been the one its key's parked jobs
    -- waited behind), but for a lock_free job (it held no key); by
    -- ix_dl_jobs_queued_lock_hash, as WAKE_LOCK_WAITERS looks
    SELECT u.job_id, u.lock_key, f.frees,
           f.frees AND (SELECT EXISTS (
               SELECT 1 FROM dl_jobs q
               WHERE q.status = 'queued' AND hashtext(q.lock_key) = hashtext(u.lock_key)
                 AND NOT q.lock_free
                 AND (q.available_at <= now()) IS TRUE AND q.job_id <> u.job_id)) AS waiter
    FROM upd u
    CROSS JOIN LATERAL (
        SELECT NOT u.lock_free
               AND (u.expect_status = 'running'
                    OR (u.expect_status = 'queued' AND u.status <> 'queued')) AS frees
    ) AS f
), again AS (
    -- a key freed with no next job in this snapshot, for which WAKE_LOCK_WAITERS will not
    -- run: a job parked behind it as it was inserted, after this snapshot, is looked for
    -- again here, in each queue, as _WAKE's `unseen` does
    SELECT dl_put_back_parked(k.lock_key, NULL) AS put_back_to
    FROM (SELECT DISTINCT ON (hashtext(w.lock_key)) w.lock_key
          FROM waiting w
          WHERE w.frees AND NOT w.waiter
          ORDER BY hashtext(w.lock_key)) AS k
)
SELECT u.job_id, 'written' AS state, u.queue, u.lock_key, u.expect_status AS left_status,
       u.status::text AS took_status, w.waiter,
       NULL::text AS status, NULL::int AS attempt, NULL::int AS max_attempts,
       NULL::int AS handbacks, NULL::bool AS cancel_requested, NULL::bool AS rerun_requested
FROM upd u JOIN waiting w ON w.job_id = u.job_id
WHERE (SELECT count(*) FROM announced) >= 0  -- sends the notifications
  AND (SELECT count(*) FROM room_freed) >= 0
  AND (SELECT count(*) FROM again) >= 0  -- looks for what this snapshot cannot see
UNION ALL
SELECT m.job_id, 'changed', NULL, NULL, NULL, NULL, false, m.row_status, m.row_attempt,
       m.max_attempts, m.row_handbacks, m.row_cancel, m.row_rerun
FROM mine m WHERE NOT m.fenced
UNION ALL
SELECT ident.job_id, 'busy', NULL, NULL, NULL, NULL, false, NULL, NULL, NULL, NULL, NULL, NULL
FROM ident WHERE ident.job_id NOT IN (SELECT job_id FROM mine)
""",
        )
    )
)

#: Next: the jobs whose lock_key a job just written frees (`freed`: job_id, lock_key, queue,
#: `left_running` (else it was queued, and ended), `handing`: whether a worker keeps a slot for
#: the next job of its key, and it left `running` for another status), and those written
#: (`written`), as WAKE_LOCK_WAITERS and HAND_OFF_NEXT read them from their parameters and
#: FINISH_JOBS from what it wrote.

#: The next due job, in claim order, of each lock_key hash freed (`next_up`), jobs just written
#: excepted: looked up once, for both _WAKE and _HAND_OFF. `{latest}` says whether it is
#: parked as it is now (`found`), and whether this statement may write it (`writable`; see
#: _NEXT_UP_LOCKED).
_NEXT_UP_SEARCH = """
, next_up AS (
    SELECT f.job_id, f.lock_key, f.queue, f.left_running, f.handing, w.job_id AS next_id,
           w.queue AS next_queue, w.lock_key AS next_key,
           CASE WHEN latest.found THEN latest.parked ELSE w.parked END AS parked,
           COALESCE(latest.writable, false) AS writable
    FROM freed f
    CROSS JOIN LATERAL (
        -- by ix_dl_jobs_queued_lock_hash: the due test is kept out of the index's reach, or
        -- statistics taken while few jobs were due send this through the spec's claim index
        -- (every due job of every queue read, for each job written)
        SELECT q.job_id, q.queue, q.lock_key, q.parked FROM dl_jobs q
        WHERE q.status = 'queued' AND hashtext(q.lock_key) = hashtext(f.lock_key)
          AND NOT q.lock_free
          AND (q.available_at <= now()) IS TRUE AND q.job_id <> f.job_id
          AND q.job_id NOT IN (SELECT job_id FROM written)
        ORDER BY q.priority, q.created_at, q.job_id
        LIMIT 1
    ) AS w
    {latest}
)"""

#: HAND_OFF_NEXT reads the next job in its own snapshot, taken after SET_JOB_STATES (an earlier
#: statement of its transaction) locked and wrote the jobs that free their keys: any parking
#: behind those jobs committed before it, and is seen.
_NEXT_UP = _NEXT_UP_SEARCH.format(
    latest="CROSS JOIN (SELECT NULL::text AS parked, false AS found, true AS writable) AS latest"
)

#: FINISH_JOBS takes its snapshot before it locks the jobs it ends (`mine`): a claim's parking
#: (PARK_JOBS) that committed in between parked the next job unseen, and a put back decided on
#: the snapshot would leave it parked behind a key that nobody holds. So the next job is also
#: locked, which reads whether it is parked as it is now, and only a job so locked is written
#: (put back, or handed off) or journalled (a collision). One that someone else holds is
#: neither waited for nor written: two ends locking the next jobs of crossing keys in
#: different orders would deadlock. Its holder is not a parking (that cannot share-lock the
#: running job, which `mine` holds); it is another end, which reads it as it is now itself, or
#: a claim, to which it is not parked, or a client's request on that job; a job left parked so
#: is put back by the reaper's sweep. (`found` and `writable` differ only in _NEXT_UP, which
#: reads nothing again and writes what its snapshot found.)
_NEXT_UP_LOCKED = _NEXT_UP_SEARCH.format(
    latest="""LEFT JOIN LATERAL (
        SELECT l.parked, true AS found, true AS writable FROM dl_jobs l
        WHERE l.job_id = w.job_id AND l.status::text = 'queued'
        FOR NO KEY UPDATE OF l SKIP LOCKED
    ) AS latest ON true"""
)

#: Whether a dl_queues row `p` keeps a job handed to a worker from running now: its queue is
#: paused, or its claims count against limits (such a job goes back into the claim's order
#: instead).
_QUEUE_CLOSED: Final = (
    "(p.paused OR p.max_running IS NOT NULL OR p.max_running_per_partition IS NOT NULL"
    " OR p.max_per_second IS NOT NULL)"
)

#: The next job of each key freed is put back into the claim's order if it was parked, unless
#: HAND_OFF_NEXT is to take it (the finished job is `handing`, and the next job of the same
#: queue: _HAND_OFF puts it back itself when it does not hand it off): two parts of one
#: statement that update one row would not both take effect. For a job that left `running`,
#: the next job is woken (dl_lock_waiter_found, migration 0006): its queue is notified, on
#: whichever replica serves it, unless `wakes_own_queue` (a worker, which serves the finished
#: job's queue and wakes it itself) and it is of the same queue; and a next job whose lock_key
#: differs from the finished one's (the same hashtext) is journalled `lock_key_collision`
#: (`woken`: each finished job whose next job was woken, and whether it collided). Every
#: other key freed, unless HAND_OFF_NEXT takes its next job (it is held again), is looked at
#: once more, in each queue (`unseen`, below).
_WAKE = f"""
, wake_put_back AS (
    -- by its primary key: a status test an index could serve let stale statistics send this
    -- through the spec's claim index, reading every queued job of the queue
    UPDATE dl_jobs q SET parked = NULL
    FROM next_up n
    WHERE q.job_id = n.next_id AND n.parked IS NOT NULL AND q.status::text = 'queued'
      AND n.writable AND NOT (n.handing AND n.next_queue = n.queue)
), woken AS (
    SELECT n.job_id,
           CASE WHEN n.writable
                THEN dl_lock_waiter_found(n.job_id, n.lock_key,
                                          CASE WHEN :wakes_own_queue THEN n.queue END,
                                          n.next_id, n.next_queue, n.next_key)
                -- one another session holds is not journalled (the journal row's foreign-key
                -- check would wait for that session): its queue is woken, as the function
                -- would wake it (in a subquery: `pg_notify(…) IS NULL AND false` is folded
                -- to false, and nothing is sent)
                WHEN NOT :wakes_own_queue OR n.next_queue <> n.queue
                THEN (SELECT false FROM (SELECT pg_notify('dl_jobs', n.next_queue)) AS sent)
                ELSE false
           END AS collision
    FROM next_up n
    WHERE n.left_running
), handed_over AS (
    -- the freed keys whose next job HAND_OFF claims for the worker (see _HAND_OFF): they are
    -- held again as this statement commits
    SELECT n.job_id FROM next_up n
    WHERE n.handing AND n.next_queue = n.queue AND n.writable
      AND NOT (SELECT EXISTS (SELECT 1 FROM dl_queues p
                              WHERE p.queue = n.next_queue AND {_QUEUE_CLOSED}))
), unseen AS (
    -- every other key freed: in each queue but the one its next job heads (put back or woken
    -- above), the first job parked behind the key goes back, so that a next job no claim
    -- takes (a paused queue, a full one, one nobody serves) holds back no other queue's; and
    -- a job parked behind the key as it was inserted, after this snapshot, is seen
    -- (dl_put_back_parked, migration 0030: see Parking at insert). Each key once, in the order
    -- of their hashes (the function takes a lock of each: two ends never take them in
    -- crossing orders); the sort reads every freed job first, so the jobs this statement
    -- ends are written before the function looks.
    SELECT dl_put_back_parked(k.lock_key, k.except_queue) AS put_back_to
    FROM (SELECT DISTINCT ON (hashtext(f.lock_key)) f.lock_key,
                 (SELECT max(n.next_queue) FROM next_up n
                  WHERE n.writable AND hashtext(n.lock_key) = hashtext(f.lock_key))
                     AS except_queue
          FROM freed f
          WHERE f.job_id NOT IN (SELECT job_id FROM handed_over)
          ORDER BY hashtext(f.lock_key)) AS k
)"""

#: The next job (`next_up`) of the lock_key hash freed by each `handing` job is claimed for
#: `actor` (the worker keeping a slot for it) when it is of the same queue, and that queue is
#: neither paused nor limited (its claims count: such a job goes back into the claim's order
#: instead, if it was parked). It is claimed as CLAIM_JOBS
#: would claim it, journalled `picked`: the jobs of a serial chain follow each other without a
#: claim or a wake-up between them. Its token is the md5 of `claim_seed` and the finished job's
#: id, which the worker knows (see RECOVER_CLAIMS). `handed`: each, as CLAIM_JOBS returns a
#: job, after the finished job's id (`after`).
_HAND_OFF = f"""
, hand_next AS (
    SELECT n.job_id, n.next_id, n.parked,
           NOT (SELECT EXISTS (SELECT 1 FROM dl_queues p
                               WHERE p.queue = n.next_queue AND {_QUEUE_CLOSED})) AS open
    FROM next_up n
    WHERE n.handing AND n.next_queue = n.queue AND n.writable
), hand_put_back AS (
    UPDATE dl_jobs q SET parked = NULL
    FROM hand_next n
    WHERE q.job_id = n.next_id AND NOT n.open AND n.parked IS NOT NULL
      AND q.status::text = 'queued'
), handed AS (
    UPDATE dl_jobs q
    SET status = 'running',
        parked = NULL,
        started_at = COALESCE(q.started_at, now()),
        attempted_at = now(),  -- a new attempt, as CLAIM_JOBS starts one
        error = NULL,
        duration_ms = NULL,
        attempt = q.attempt + 1,
        claim_seq = q.claim_seq + 1,
        claim_token = md5(:claim_seed::uuid::text || '/' || n.job_id::text)::uuid,
        worker_id = :actor,
        lease_expires_at = now() + make_interval(secs => q.lease_ttl_sec),
        heartbeat_at = now()
    FROM hand_next n
    WHERE q.job_id = n.next_id AND n.open AND q.status::text = 'queued'
    RETURNING n.job_id AS after, q.job_id, q.queue, q.task, q.args, q.lock_key,
              hashtext(q.lock_key) AS lock_hash, q.partition_key, q.priority, q.attempt,
              q.max_attempts, q.lease_ttl_sec, q.cancel_requested, q.claim_seq, q.claim_token,
              q.handbacks, q.rerun_requested, q.checkpoint
), handed_ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'picked', jsonb_build_object('attempt', attempt, 'worker', :actor::text)
    FROM handed
)"""

#: Wake the next job of each lock_key freed by jobs SET_JOB_STATES just wrote (`job_ids`, with
#: their `lock_keys`, `queues`, `left_running` and `handing`; `written_ids`: every job it
#: wrote): see _WAKE. Run after it in the same transaction (its rows stay locked: a claim still
#: sees them running, and PARK_JOBS cannot share-lock them), and before HAND_OFF_NEXT. It locks
#: the next job it finds, as FINISH_JOBS does (_NEXT_UP_LOCKED): until this end commits, an end
#: of that job (a cancel) is held off, and cannot look for a job parked at insert while the
#: job this end wrote still runs to it (see Parking at insert).
WAKE_LOCK_WAITERS: Final = Statement(
    "".join(
        (
            """
WITH freed AS (
    SELECT * FROM unnest(:job_ids::uuid[], :lock_keys::text[], :queues::text[],
                         :left_running::bool[], :handing::bool[])
                  AS f(job_id, lock_key, queue, left_running, handing)
), written AS (
    SELECT unnest(:written_ids::uuid[]) AS job_id
)""",
            _NEXT_UP_LOCKED,
            _WAKE,
            """
SELECT job_id, collision FROM woken
WHERE (SELECT count(*) FROM unseen) >= 0  -- looks for what this snapshot cannot see
""",
        )
    )
)

#: Hand off the next job of each lock_key freed by the jobs named (`job_ids`, with their
#: `lock_keys` and `queues`: jobs SET_JOB_STATES just moved from `running` to another status,
#: for a worker that keeps a slot for that next job; `written_ids`: every job it wrote): see
#: _HAND_OFF. Run after WAKE_LOCK_WAITERS in the same transaction.
HAND_OFF_NEXT: Final = Statement(
    "".join(
        (
            """
WITH freed AS (
    SELECT f.*, true AS left_running, true AS handing
    FROM unnest(:job_ids::uuid[], :lock_keys::text[], :queues::text[])
         AS f(job_id, lock_key, queue)
), written AS (
    SELECT unnest(:written_ids::uuid[]) AS job_id
)""",
            _NEXT_UP,
            _HAND_OFF,
            """
SELECT h.after, (to_jsonb(h) - 'after')::text AS handed FROM handed h
""",
        )
    )
)

#: FINISH_JOBS's common table expressions: `_SET_STATES`, then what frees, wakes and hands
#: off the next jobs (a statement that adds its own writes to a finish puts them after these,
#: reading `upd`: the jobs written).
FINISH_JOBS_CTES: Final = "".join(
    (
        _SET_STATES,
        """
, freed AS (
    -- a job leaving `running`, or a queued job ending (it may have been the one its key's
    -- parked jobs waited behind); a lock_free job frees no key
    SELECT u.job_id, u.lock_key, u.queue, u.expect_status = 'running' AS left_running,
           u.expect_status = 'running' AND u.status::text <> 'running'
               AND u.job_id = ANY(:hand_off::uuid[]) AS handing
    FROM upd u
    WHERE (u.expect_status = 'running' OR (u.expect_status = 'queued' AND u.status <> 'queued'))
      AND NOT u.lock_free
), written AS (
    SELECT job_id FROM upd
)""",
        _NEXT_UP_LOCKED,
        _WAKE,
        _HAND_OFF,
    )
)

#: FINISH_JOBS's answer: one row per job (see FINISH_JOBS).
FINISH_JOBS_ANSWER: Final = """
SELECT u.job_id, 'written' AS state, COALESCE(woken.collision, false) AS collision,
       NULL::text AS status, NULL::int AS attempt, NULL::int AS max_attempts,
       NULL::int AS handbacks, NULL::bool AS cancel_requested, NULL::bool AS rerun_requested,
       (SELECT (to_jsonb(h) - 'after')::text FROM handed h WHERE h.after = u.job_id) AS handed
FROM upd u LEFT JOIN woken ON woken.job_id = u.job_id
WHERE (SELECT count(*) FROM announced) >= 0  -- sends the notifications
  AND (SELECT count(*) FROM room_freed) >= 0
  AND (SELECT count(*) FROM unseen) >= 0  -- looks for what this snapshot cannot see
UNION ALL
SELECT m.job_id, 'changed', false, m.row_status, m.row_attempt, m.max_attempts,
       m.row_handbacks, m.row_cancel, m.row_rerun, NULL
FROM mine m WHERE NOT m.fenced
UNION ALL
SELECT ident.job_id, 'busy', false, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM ident WHERE ident.job_id NOT IN (SELECT job_id FROM mine)
"""

#: SET_JOB_STATES, WAKE_LOCK_WAITERS and HAND_OFF_NEXT in one statement (one round trip, the
#: worker's finish): the jobs named in `hand_off` are `handing`. Each job comes back as from
#: SET_JOB_STATES (`written`, `changed`, `busy`), a written one with whether its next job
#: collided (`collision`) and the job handed to the caller (`handed`, JSON). Every part reads
#: the database as it was when the statement started: the next jobs they find are the same,
#: and the rows they write are not (WAKE's put back spares the job HAND_OFF is to take).
FINISH_JOBS: Final = Statement(FINISH_JOBS_CTES + FINISH_JOBS_ANSWER)

# --- reaper --------------------------------------------------------------------------------

#: Running jobs whose lease expired (spec §6.5) or whose owner is gone, at most `limit`, oldest
#: lease first, with the facts the reaper decides on (it then applies its transitions fenced on
#: the same test, still true). An owner is gone once its presence row (`dl_workers`) was not
#: refreshed within three of its periods, by the database's clock (LIVE_WORKERS's liveness):
#: every process stops its own jobs before that (`workers.fencing`), so its jobs are taken back
#: then, not a lease later. An owner without a row (deregistered at a clean stop while its last
#: jobs wind down) is never gone: its jobs wait for their leases. Rows someone else holds (a
#: task fencing its writes with FOR SHARE, another reaper) are skipped: however many of them
#: head the list, the jobs behind them are reached. Running jobs are few (the processes'
#: slots): the owner test reads each of them once.
EXPIRED_JOBS: Final = Statement("""
SELECT j.job_id, j.queue, j.task, j.claim_token, j.status::text AS status, j.attempt,
       j.max_attempts, j.handbacks, j.cancel_requested, j.rerun_requested
FROM dl_jobs j
WHERE j.status = 'running' AND j.lease_expires_at IS NOT NULL
  AND (j.lease_expires_at < now()
       OR EXISTS (SELECT 1 FROM dl_workers w
                  WHERE w.worker_id = j.worker_id
                    AND w.seen_at < now() - make_interval(secs => 3 * w.period_sec)))
ORDER BY j.lease_expires_at
LIMIT :limit
FOR NO KEY UPDATE OF j SKIP LOCKED
""")

#: Seconds until a running job next becomes the reaper's (EXPIRED_JOBS): its lease runs out, or
#: its owner turns gone unless it refreshes its presence meanwhile; NULL if no job will. Only
#: moments still to come count (a job already due but skipped is found at the next sweep).
NEXT_REAPABLE_IN: Final = """
SELECT EXTRACT(EPOCH FROM LEAST(
           (SELECT min(lease_expires_at) FROM dl_jobs
            WHERE status = 'running' AND lease_expires_at > now()),
           (SELECT min(w.seen_at + make_interval(secs => 3 * w.period_sec)) FROM dl_workers w
            WHERE w.seen_at + make_interval(secs => 3 * w.period_sec) > now()
              AND EXISTS (SELECT 1 FROM dl_jobs j
                          WHERE j.status = 'running' AND j.worker_id = w.worker_id))
       ) - now())::float8 AS due_in
"""

# --- advisory locks (on the lock-holding connection) --------------------------------------------

#: Try the session-level advisory locks of several lock_key hashes (`hashtext(lock_key)`, the
#: spec's key space) in one round trip.
TRY_ADVISORY_LOCKS: Final = Statement("""
SELECT h AS lock_hash, pg_try_advisory_lock(h) AS locked FROM unnest(:lock_hashes::bigint[]) AS h
""")

#: Release session-level advisory locks, one level per hash.
ADVISORY_UNLOCK: Final = Statement("""
SELECT count(*) FILTER (WHERE pg_advisory_unlock(h)) FROM unnest(:lock_hashes::bigint[]) AS h
""")

#: Release one level of each hash this session holds; returns the hashes released (a lock taken
#: twice by the session needs two releases).
ADVISORY_UNLOCK_HELD: Final = Statement("""
SELECT h AS lock_hash FROM unnest(:lock_hashes::bigint[]) AS h WHERE pg_advisory_unlock(h)
""")

#: The one-key advisory locks this session holds (the key spaces of `hashtext(lock_key)`): the
#: key is split in pg_locks into its high (classid) and low (objid) 32 bits.
HELD_ADVISORY_LOCKS: Final = """
SELECT (classid::bigint << 32) | objid::bigint AS lock_hash FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid() AND granted
"""

#: This session's identity: pid and start time (a pid alone may be reused).
SESSION_IDENTITY: Final = """
SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
"""

#: End a session of ours we gave up on (matched by pid and start time). A lock connection that
#: went half-open keeps its advisory locks on the server until the server notices the silence,
#: which TCP keepalive does after hours by default; ending it frees them now.
END_SESSION: Final = Statement("""
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE pid = :pid AND backend_start = :backend_start
""")

#: Liveness probe of a dedicated connection; also the first statement of a SQLAlchemy
#: transaction that has not sent its BEGIN yet (the statement sends it).
PING: Final = "SELECT 1"

#: A savepoint around a batch of jobs written inside the caller's transaction, however the
#: caller began it (asyncpg's nested transactions refuse a transaction begun by a plain BEGIN).
SAVEPOINT: Final = "SAVEPOINT dl_enqueue_many"
RELEASE_SAVEPOINT: Final = "RELEASE SAVEPOINT dl_enqueue_many"
ROLLBACK_TO_SAVEPOINT: Final = "ROLLBACK TO SAVEPOINT dl_enqueue_many"

# --- live workers (presence) ----------------------------------------------------------------

#: Record this process (`queues`: {queue: concurrency} as JSON text, `tasks`: task names,
#: `period_sec`: its refresh period) or refresh its row; the same statement prunes rows of
#: other processes not seen for `prune_after_sec` (processes that died without deregistering).
#: A process whose row was pruned while it was frozen comes back at its next refresh.
UPSERT_WORKER: Final = Statement("""
WITH pruned AS (
    DELETE FROM dl_workers
    WHERE seen_at < now() - make_interval(secs => :prune_after_sec::float8)
      AND worker_id <> :worker_id
)
INSERT INTO dl_workers (worker_id, host, pid, version, queues, tasks, task_specs, period_sec)
VALUES (:worker_id, :host, :pid, :version, :queues::text::jsonb, :tasks::text[],
        :task_specs::text::jsonb, :period_sec)
ON CONFLICT (worker_id) DO UPDATE
SET queues = EXCLUDED.queues, tasks = EXCLUDED.tasks, period_sec = EXCLUDED.period_sec,
    seen_at = now(),
    -- the stored value kept when unchanged: a large one is not written out again (TOAST) at
    -- every refresh
    task_specs = CASE WHEN dl_workers.task_specs = EXCLUDED.task_specs THEN dl_workers.task_specs
                      ELSE EXCLUDED.task_specs END
""")

#: The presence of a process whose event loop is held (by a handler's blocking call): the row is
#: kept fresh by the process's watchdog thread alone (nothing else of the row can be read
#: there); a row already deleted (a clean stop) stays deleted.
TOUCH_WORKER: Final = Statement(
    "UPDATE dl_workers SET seen_at = now() WHERE worker_id = :worker_id RETURNING true"
)

#: A clean stop: this process serves nothing any more.
DELETE_WORKER: Final = Statement("DELETE FROM dl_workers WHERE worker_id = :worker_id")

#: Live processes (refreshed within three of their own periods, on the database's clock: one
#: late refresh is no death), with how long ago each was seen.
LIVE_WORKERS: Final = """
SELECT worker_id, host, pid, version, queues::text AS queues, tasks, started_at,
       EXTRACT(EPOCH FROM now() - seen_at)::float8 AS seen_ago_sec
FROM dl_workers
WHERE seen_at > now() - make_interval(secs => 3 * period_sec)
ORDER BY worker_id
"""

#: The contracts of the tasks live processes know, each with the processes that publish it
#: (LIVE_WORKERS's liveness). Processes of different versions may publish different contracts
#: under one name: each is a row.
LIVE_TASK_SPECS: Final = """
SELECT s.key AS task, s.value::text AS spec, array_agg(w.worker_id ORDER BY w.worker_id) AS workers
FROM dl_workers w CROSS JOIN LATERAL jsonb_each(w.task_specs) AS s
WHERE w.seen_at > now() - make_interval(secs => 3 * w.period_sec)
GROUP BY s.key, s.value
ORDER BY s.key, min(w.worker_id)
"""

#: Each task live processes know, once per queue its definitions name (NULL: none, so any
#: queue), and the queues live processes serve (task NULL), by LIVE_WORKERS's liveness.
LIVE_ROUTES: Final = """
SELECT DISTINCT t.task, w.task_specs -> t.task ->> 'queue' AS queue
FROM dl_workers w CROSS JOIN LATERAL unnest(w.tasks) AS t(task)
WHERE w.seen_at > now() - make_interval(secs => 3 * w.period_sec)
UNION
SELECT DISTINCT NULL, q.queue
FROM dl_workers w CROSS JOIN LATERAL jsonb_object_keys(w.queues) AS q(queue)
WHERE w.seen_at > now() - make_interval(secs => 3 * w.period_sec)
ORDER BY 1, 2
"""

#: Each (task, queue) of queued jobs (delayed and waiting ones included), without reading the
#: table: a skip scan of `ix_dl_jobs_queued_task` (migration 0019), one index probe per pair.
QUEUED_TASKS: Final = """
WITH RECURSIVE p(task, queue) AS (
    (SELECT task, queue FROM dl_jobs WHERE status = 'queued' ORDER BY task, queue LIMIT 1)
    UNION ALL
    SELECT n.task, n.queue FROM p CROSS JOIN LATERAL (
        SELECT j.task, j.queue FROM dl_jobs j
        WHERE j.status = 'queued' AND (j.task, j.queue) > (p.task, p.queue)
        ORDER BY j.task, j.queue LIMIT 1
    ) n
)
SELECT task, queue FROM p ORDER BY task, queue
"""

#: Queues with ready jobs (queued, available_at <= now()), without reading the table: a skip
#: scan walks the distinct queues of the spec's `ix_dl_jobs_claim` (queue, available_at, …,
#: which only holds queued rows), one index probe per queue, and the first entry of each queue
#: says whether one of its jobs is ready. A million finished jobs cost nothing here; a
#: `SELECT DISTINCT queue` would read them all.
READY_QUEUES: Final = """
WITH RECURSIVE q(queue) AS (
    SELECT min(queue) FROM dl_jobs WHERE status = 'queued'
    UNION ALL
    SELECT (SELECT min(j.queue) FROM dl_jobs j WHERE j.status = 'queued' AND j.queue > q.queue)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT q.queue FROM q
WHERE q.queue IS NOT NULL
  AND EXISTS (SELECT 1 FROM dl_jobs j
              WHERE j.status = 'queued' AND j.queue = q.queue AND j.available_at <= now())
ORDER BY q.queue
"""

# --- queues: pause, resume, audit, throughput -------------------------------------------------

#: Pause `queue` for `actor` (no claim of any replica takes its jobs any more), journaling it
#: in the queue's audit log; a queue already paused is left as it is (nothing journaled). The
#: queue's settings as they are after.
PAUSE_QUEUE: Final = Statement("""
WITH changed AS (
    INSERT INTO dl_queues (queue, paused, changed_by) VALUES (:queue, true, :actor)
    ON CONFLICT (queue) DO UPDATE SET paused = true, changed_at = now(), changed_by = :actor
    WHERE NOT dl_queues.paused
    RETURNING queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
              max_per_second
), ev AS (
    INSERT INTO dl_queue_events (queue, kind, actor) SELECT queue, 'paused', :actor FROM changed
)
SELECT * FROM changed
UNION ALL
SELECT queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
       max_per_second FROM dl_queues
WHERE queue = :queue AND NOT EXISTS (SELECT 1 FROM changed)
""")

#: Resume a paused `queue` for `actor`, journaling it, and wake the workers serving it; a queue
#: not paused is left as it is. The queue's settings as they are after (no row: the queue was
#: never paused).
RESUME_QUEUE: Final = Statement("""
WITH changed AS (
    UPDATE dl_queues SET paused = false, changed_at = now(), changed_by = :actor
    WHERE queue = :queue AND paused
    RETURNING queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
              max_per_second
), ev AS (
    INSERT INTO dl_queue_events (queue, kind, actor) SELECT queue, 'resumed', :actor FROM changed
)
SELECT *, pg_notify('dl_jobs', queue) IS NULL AS woken FROM changed
UNION ALL
SELECT queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
       max_per_second, false FROM dl_queues
WHERE queue = :queue AND NOT EXISTS (SELECT 1 FROM changed)
""")

#: One queue's settings (no row: nothing was ever set on it).
QUEUE_SETTING: Final = Statement("""
SELECT queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
       max_per_second
FROM dl_queues WHERE queue = :queue
""")

#: Every queue's settings (one row per queue an operator set something on), by name.
QUEUE_SETTINGS: Final = """
SELECT queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
       max_per_second
FROM dl_queues ORDER BY queue
"""

#: Set `queue`'s limits for `actor` (NULL: none), journaling them in its audit log when they
#: change, and wake its workers (looser limits may let them claim). A new rate starts with a
#: full bucket. The queue's settings after.
SET_QUEUE_LIMITS: Final = Statement("""
WITH changed AS (
    INSERT INTO dl_queues AS q (queue, changed_by, max_running, max_running_per_partition,
                                max_per_second)
    VALUES (:queue, :actor, :max_running, :max_running_per_partition, :max_per_second)
    ON CONFLICT (queue) DO UPDATE
    SET max_running = EXCLUDED.max_running,
        max_running_per_partition = EXCLUDED.max_running_per_partition,
        max_per_second = EXCLUDED.max_per_second,
        tokens = CASE WHEN q.max_per_second IS NOT DISTINCT FROM EXCLUDED.max_per_second
                      THEN q.tokens END,
        changed_at = now(), changed_by = EXCLUDED.changed_by
    WHERE (q.max_running, q.max_running_per_partition, q.max_per_second)
          IS DISTINCT FROM (EXCLUDED.max_running, EXCLUDED.max_running_per_partition,
                            EXCLUDED.max_per_second)
    RETURNING queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
              max_per_second
), ev AS (
    INSERT INTO dl_queue_events (queue, kind, actor, payload)
    SELECT queue, 'limits', :actor,
           jsonb_build_object('max_running', max_running,
                              'max_running_per_partition', max_running_per_partition,
                              'max_per_second', max_per_second)
    FROM changed
)
SELECT *, pg_notify('dl_jobs', queue) IS NULL AS woken FROM changed
UNION ALL
SELECT queue, paused, changed_at, changed_by, max_running, max_running_per_partition,
       max_per_second, false FROM dl_queues
WHERE queue = :queue AND NOT EXISTS (SELECT 1 FROM changed)
""")

#: A queue's audit log, oldest first: the entries after `:after` (an event_id), `:limit` at most.
QUEUE_EVENTS: Final = Statement("""
SELECT event_id, ts, kind, actor, payload::text AS payload FROM dl_queue_events
WHERE queue = :queue AND event_id > :after
ORDER BY event_id
LIMIT :limit
""")

#: Add a process's counts of ended attempts (`queues`, `kinds`, `counts`: one element per
#: queue and journal kind) to the current 10-second bucket (the pruner deletes old buckets).
ADD_THROUGHPUT: Final = Statement("""
INSERT INTO dl_queue_throughput AS t (queue, bucket, kind, n)
SELECT c.queue, to_timestamp(floor(EXTRACT(EPOCH FROM now()) / 10) * 10), c.kind, c.n
FROM unnest(:queues::text[], :kinds::text[], :counts::bigint[]) AS c(queue, kind, n)
ON CONFLICT (queue, bucket, kind) DO UPDATE SET n = t.n + EXCLUDED.n
""")

#: Attempts ended per queue and journal kind within the last 60, 300 and 3600 seconds.
QUEUE_THROUGHPUT: Final = Statement("""
SELECT queue, kind,
       COALESCE(sum(n) FILTER (WHERE bucket > now() - interval '60 seconds'), 0)::bigint AS n_60,
       COALESCE(sum(n) FILTER (WHERE bucket > now() - interval '300 seconds'), 0)::bigint AS n_300,
       sum(n)::bigint AS n_3600
FROM dl_queue_throughput
WHERE bucket > now() - interval '3600 seconds' AND (queue = :queue::text OR :queue::text IS NULL)
GROUP BY queue, kind
""")

#: Attempts ended per journal kind in each `step_sec` of the last `span_sec` seconds (every
#: queue together, or `queue`'s), oldest first: the throughput buckets (10 s each, a day's
#: kept), never the jobs.
THROUGHPUT_SERIES: Final = Statement("""
SELECT to_timestamp(floor(EXTRACT(EPOCH FROM bucket) / :step_sec::float8) * :step_sec::float8)
           AS at,
       kind, sum(n)::bigint AS n
FROM dl_queue_throughput
WHERE bucket > now() - make_interval(secs => :span_sec::float8)
  AND (queue = :queue::text OR :queue::text IS NULL)
GROUP BY 1, 2
ORDER BY 1
""")

# --- maintenance: leases, runs, pruning ----------------------------------------------------

#: Take or renew the lease `name` for `holder` until `ttl_sec` from now: renewed if `holder`
#: has it, taken if nobody has or its holder let it expire. Returns the lease (holder, since
#: when, until when) if `holder` has it now; no row if another process does.
ACQUIRE_LEASE: Final = Statement("""
INSERT INTO dl_leases AS l (name, holder, expires_at)
VALUES (:name, :holder, now() + make_interval(secs => :ttl_sec::float8))
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.acquired_at ELSE now() END,
    renewed_at = now(),
    expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at < now()
RETURNING holder, acquired_at, expires_at
""")

#: Give up the lease `name` if `holder` has it (a clean stop: the next process takes it at once).
RELEASE_LEASE: Final = Statement("""
DELETE FROM dl_leases WHERE name = :name AND holder = :holder
""")

#: Every lease, with whether it is still valid by the database's clock.
LEASES: Final = """
SELECT name, holder, acquired_at, renewed_at, expires_at, expires_at > now() AS valid
FROM dl_leases ORDER BY name
"""

#: Record a run of the maintenance task `task` by `holder` that ended now after `duration_sec`
#: (`ok`, or failed with `error`; `detail` as JSON text).
RECORD_MAINTENANCE_RUN: Final = Statement("""
INSERT INTO dl_maintenance_runs AS r (task, holder, started_at, ok, error, detail)
VALUES (:task, :holder, now() - make_interval(secs => :duration_sec::float8), :ok, :error,
        :detail::text::jsonb)
ON CONFLICT (task) DO UPDATE
SET holder = EXCLUDED.holder, started_at = EXCLUDED.started_at, finished_at = now(),
    ok = EXCLUDED.ok, error = EXCLUDED.error, detail = EXCLUDED.detail, runs = r.runs + 1
""")

#: The last run of each maintenance task.
MAINTENANCE_RUNS: Final = """
SELECT task, holder, started_at, finished_at, ok, error, detail::text AS detail, runs,
       EXTRACT(EPOCH FROM now() - finished_at)::float8 AS ago_sec
FROM dl_maintenance_runs ORDER BY task
"""

#: Delete up to `limit` jobs that ended `status` more than `after_sec` ago, the oldest first,
#: with their journals (the foreign key cascades); rows someone holds are left for a later
#: batch. Returns how many were deleted.
PRUNE_JOBS: Final = Statement("""
WITH doomed AS (
    SELECT job_id FROM dl_jobs
    WHERE status = :status::dl_status AND finished_at IS NOT NULL
      AND finished_at < now() - make_interval(secs => :after_sec::float8)
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM dl_jobs j USING doomed d WHERE j.job_id = d.job_id RETURNING 1
)
SELECT count(*) FROM gone
""")

#: Delete up to `limit` heartbeat entries of the journal older than `after_sec`, the oldest
#: first. Returns how many were deleted.
PRUNE_HEARTBEATS: Final = Statement("""
WITH gone AS (
    DELETE FROM dl_job_events WHERE event_id IN (
        SELECT event_id FROM dl_job_events
        WHERE kind = 'heartbeat' AND ts < now() - make_interval(secs => :after_sec::float8)
        ORDER BY ts
        LIMIT :limit)
    RETURNING 1
)
SELECT count(*) FROM gone
""")

#: Delete throughput buckets older than `after_sec` (a day's are read at most), `limit` at most.
PRUNE_THROUGHPUT: Final = Statement("""
WITH gone AS (
    DELETE FROM dl_queue_throughput WHERE (queue, bucket, kind) IN (
        SELECT queue, bucket, kind FROM dl_queue_throughput
        WHERE bucket < now() - make_interval(secs => :after_sec::float8)
        LIMIT :limit)
    RETURNING 1
)
SELECT count(*) FROM gone
""")

#: How many jobs PRUNE_JOBS would delete now, all batches together (`dataloader prune
#: --dry-run`): a count over the same range of the finished jobs' index.
COUNT_PRUNABLE_JOBS: Final = Statement("""
SELECT count(*) FROM dl_jobs
WHERE status = :status::dl_status AND finished_at IS NOT NULL
  AND finished_at < now() - make_interval(secs => :after_sec::float8)
""")

#: How many heartbeat entries PRUNE_HEARTBEATS would delete now, all batches together.
COUNT_PRUNABLE_HEARTBEATS: Final = Statement("""
SELECT count(*) FROM dl_job_events
WHERE kind = 'heartbeat' AND ts < now() - make_interval(secs => :after_sec::float8)
""")

#: The database's clock (every time dataloader decides on comes from it).
DB_NOW: Final = "SELECT now()"

#: Every periodic task's schedule as last written, with the last slot enqueued for it.
CRON_STATE: Final = """
SELECT name, schedule, task, queue, last_slot, updated_at, timezone FROM dl_cron ORDER BY name
"""

#: Record schedule `name` as declared now, and the last slot enqueued for it (`last_slot`).
SET_CRON: Final = Statement("""
INSERT INTO dl_cron AS c (name, schedule, task, queue, last_slot, timezone)
VALUES (:name, :schedule, :task, :queue, :last_slot, :timezone)
ON CONFLICT (name) DO UPDATE
SET schedule = EXCLUDED.schedule, task = EXCLUDED.task, queue = EXCLUDED.queue,
    last_slot = EXCLUDED.last_slot, timezone = EXCLUDED.timezone, updated_at = now()
""")

# --- migrations ----------------------------------------------------------------------------

#: Serialises migrations across replicas: a session-level lock in the two-key space of advisory
#: locks, which never meets the one-key space of jobs' `hashtext(lock_key)` (a user's lock_key
#: that hashes like our name cannot block migrations, nor be blocked by them). Keys: a class
#: number of dataloader's own internal locks (0x646c6f6b, "dlok" in ASCII), then the lock's.
MIGRATION_LOCK: Final = "SELECT pg_advisory_lock(1684828011, 1)"
MIGRATION_UNLOCK: Final = "SELECT pg_advisory_unlock(1684828011, 1)"

# --- listening for ended jobs --------------------------------------------------------------

#: Held, shared, by every session that LISTENs on `dl_job_finished` (a client's waits), from
#: before its LISTEN until after its UNLISTEN: SET_JOB_STATES announces ended jobs only
#: while someone holds it (its exclusive try fails). Same key space as MIGRATION_LOCK.
#: Where SET_JOB_STATES announces ended jobs (their ids, comma-separated).
FINISHED_CHANNEL: Final = "dl_job_finished"

LISTENER_LOCK: Final = "SELECT pg_advisory_lock_shared(1684828011, 2)"
LISTENER_UNLOCK: Final = "SELECT pg_advisory_unlock_shared(1684828011, 2)"

CREATE_MIGRATIONS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS dl_schema_migrations (
    version int PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    adopted boolean NOT NULL DEFAULT false
)
"""

APPLIED_MIGRATIONS: Final = "SELECT version FROM dl_schema_migrations ORDER BY version"

RECORD_MIGRATION: Final = Statement("""
INSERT INTO dl_schema_migrations (version, name, adopted) VALUES (:version, :name, :adopted)
""")

#: Which of the spec's objects already exist (a database the customer prepared by hand).
SPEC_OBJECTS_PRESENT: Final = """
SELECT to_regclass('dl_jobs') IS NOT NULL AS jobs,
       to_regclass('dl_job_events') IS NOT NULL AS events,
       to_regtype('dl_status') IS NOT NULL AS status_type
"""

# --- start-up checks -----------------------------------------------------------------------

#: Which database a connection reaches, and its server's start time: two connections that
#: answer alike reach the same database of the same server (`Runner(pool=…)` must share the
#: database its workers connect to).
DATABASE_IDENTITY: Final = (
    "SELECT current_database() AS database, pg_postmaster_start_time() AS server_started"
)
