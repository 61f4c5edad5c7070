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

from typing import Final

#: Channel of the spec's trigger: payload = queue name of a job that became ready.
JOBS_CHANNEL: Final = "dl_jobs"
#: Our channel for cancel requests of running jobs: payload = job_id.
CANCEL_CHANNEL: Final = "dl_jobs_cancel"

# --- producers ---------------------------------------------------------------------------------

#: Insert one job unless its idempotency_key exists; journal `queued` in the same statement.
#: Returns no row on an idempotency conflict (then read the existing job with JOBS_BY_IDEMPOTENCY).
#: $3 = args as JSON text: any asyncpg connection sends text, with or without a json codec.
INSERT_JOB: Final = """
WITH ins AS (
    INSERT INTO dl_jobs (job_id, queue, task, args, idempotency_key, lock_key, partition_key,
                         priority, available_at, max_attempts, lease_ttl_sec, producer,
                         consumer_group)
    VALUES (gen_random_uuid(), $1, $2, $3::text::jsonb, $4, $5, $6, $7, COALESCE($8, now()), $9,
            $10, $11, $12)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, queue, status, available_at
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'queued', jsonb_build_object('available_at', available_at) FROM ins
)
SELECT job_id, status::text AS status FROM ins
"""

#: Insert many jobs in one statement (arrays, one element per job; $1 = job ids chosen by the
#: caller so that results map back to inputs). Jobs whose idempotency_key exists are skipped;
#: the inserted ids come back. Journals `queued` for each inserted job.
INSERT_JOBS: Final = """
WITH ins AS (
    INSERT INTO dl_jobs (job_id, queue, task, args, idempotency_key, lock_key, partition_key,
                         priority, available_at, max_attempts, lease_ttl_sec, producer,
                         consumer_group)
    SELECT t.job_id, t.queue, t.task, t.args::jsonb, t.idempotency_key, t.lock_key,
           t.partition_key, t.priority, COALESCE(t.available_at, now()), t.max_attempts,
           t.lease_ttl_sec, t.producer, t.consumer_group
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::int[], $9::timestamptz[], $10::int[], $11::int[], $12::text[],
                $13::text[])
         AS t(job_id, queue, task, args, idempotency_key, lock_key, partition_key, priority,
              available_at, max_attempts, lease_ttl_sec, producer, consumer_group)
    ORDER BY t.idempotency_key  -- one key order for every batch: no deadlock between batches
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id, queue, available_at
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'queued', jsonb_build_object('available_at', available_at) FROM ins
)
SELECT job_id FROM ins
"""

#: The jobs holding some idempotency keys, and which fields of the jobs asked for under those
#: keys differ from theirs (arrays, one element per asked-for job, in INSERT_JOBS's order
#: without the ids). "The same job" compares every field as it would be stored (a default is a
#: value), except that an omitted (NULL) available_at, producer or consumer_group is no
#: difference; a given available_at is compared with the one the job was queued with (its
#: `queued` event), not with today's, which retries and backoffs move.
JOBS_BY_IDEMPOTENCY: Final = """
SELECT t.idempotency_key, j.job_id, j.status::text AS status,
       array_remove(ARRAY[
           CASE WHEN j.queue <> t.queue THEN 'queue' END,
           CASE WHEN j.task <> t.task THEN 'task' END,
           CASE WHEN j.args <> t.args::jsonb THEN 'args' END,
           CASE WHEN j.lock_key <> t.lock_key THEN 'lock_key' END,
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
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[],
            $8::timestamptz[], $9::int[], $10::int[], $11::text[], $12::text[])
     AS t(queue, task, args, idempotency_key, lock_key, partition_key, priority, available_at,
          max_attempts, lease_ttl_sec, producer, consumer_group)
JOIN dl_jobs j ON j.idempotency_key = t.idempotency_key
"""

# --- readers -------------------------------------------------------------------------------

#: One job's public state.
JOB_STATUS: Final = """
SELECT job_id, queue, task, status::text AS status, attempt, max_attempts, cancel_requested,
       created_at, available_at, started_at, finished_at, heartbeat_at, error, progress
FROM dl_jobs WHERE job_id = $1
"""

#: Job counts per queue and status (for /status).
QUEUE_COUNTS: Final = """
SELECT queue, status::text AS status, count(*) AS n FROM dl_jobs GROUP BY queue, status
"""

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

#: A job's journal, oldest first.
JOB_EVENTS: Final = """
SELECT event_id, kind, ts, payload FROM dl_job_events WHERE job_id = $1 ORDER BY event_id
"""

# --- cancel --------------------------------------------------------------------------------

#: Cancel: a queued job becomes `canceled` at once; a running one gets `cancel_requested`.
#: Finished jobs (and already-requested ones) are left alone. Returns the new status if changed.
CANCEL_JOB: Final = """
WITH upd AS (
    UPDATE dl_jobs
    SET cancel_requested = true,
        status = CASE WHEN status = 'queued' THEN 'canceled'::dl_status ELSE status END,
        finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END
    WHERE job_id = $1
      AND (status::text = 'queued' OR (status::text = 'running' AND NOT cancel_requested))
    RETURNING job_id, queue, status, attempt
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue,
           CASE WHEN status = 'canceled' THEN 'canceled' ELSE 'cancel_requested' END,
           jsonb_build_object('attempt', attempt, 'by', 'api')
    FROM upd
)
SELECT status::text AS status FROM upd
"""

#: Wake the worker running a job whose cancel was just requested.
NOTIFY_CANCEL: Final = "SELECT pg_notify('dl_jobs_cancel', $1::text)"

# --- workers: claim ----------------------------------------------------------------------------

#: Claim up to $2 ready jobs of queue $1 (the spec's CTE, batched). Jobs whose lock_key hash is
#: already running are skipped (they would only back off; keys that collide under hashtext wait
#: in claim order like jobs of one key), and one job per hash is taken per batch. Each claim
#: increments `claim_seq` and takes a new `claim_token`, the fence of every later write: the
#: md5 of a random UUID the worker draws for the claim ($4) and the row's number in the batch,
#: unique for every claim on any server (PostgreSQL's gen_random_uuid() cost ~13 µs a row
#: here, a tenth of a claim of ten). Journals `picked`. $3 = worker id.
CLAIM_JOBS: Final = """
WITH candidates AS (
    SELECT j.job_id, hashtext(j.lock_key) AS lock_hash, j.priority, j.created_at
    FROM dl_jobs j
    WHERE j.status = 'queued' AND j.queue = $1 AND j.available_at <= now()
      -- A per-row probe of ix_dl_jobs_running_lock_hash. Wrapped in a scalar subquery on
      -- purpose: a bare NOT EXISTS becomes an anti-join that may scan every running job.
      AND NOT (SELECT EXISTS (
          SELECT 1 FROM dl_jobs r
          WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = hashtext(j.lock_key)))
    ORDER BY j.priority ASC, j.created_at ASC
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT job_id, row_number() OVER () AS n FROM (
        SELECT DISTINCT ON (lock_hash) job_id FROM candidates
        ORDER BY lock_hash, priority, created_at
    ) AS one_per_key
), claimed AS (
    UPDATE dl_jobs j
    SET status = 'running',
        started_at = COALESCE(j.started_at, now()),
        attempt = j.attempt + 1,
        claim_seq = j.claim_seq + 1,
        claim_token = md5($4::uuid::text || '/' || picked.n)::uuid,
        lease_expires_at = now() + make_interval(secs => j.lease_ttl_sec),
        heartbeat_at = now()
    FROM picked
    WHERE j.job_id = picked.job_id
    RETURNING j.job_id, j.queue, j.task, j.args, j.lock_key, hashtext(j.lock_key) AS lock_hash,
              j.partition_key, j.priority, j.created_at, j.attempt, j.max_attempts,
              j.lease_ttl_sec, j.cancel_requested, j.claim_seq, j.claim_token
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'picked', jsonb_build_object('attempt', attempt, 'worker', $3::text)
    FROM claimed
)
SELECT * FROM claimed ORDER BY priority, created_at
"""

#: Seconds until the earliest delayed job of queue $1 becomes due (NULL: none).
NEXT_DUE_IN: Final = """
SELECT EXTRACT(EPOCH FROM min(available_at) - now())::float8 AS seconds
FROM dl_jobs WHERE status = 'queued' AND queue = $1 AND available_at > now()
"""

#: Busy lock_key: hand the job back, refunding the attempt (it never ran); a job whose cancel was
#: requested meanwhile ends `canceled` instead. When it may run again depends on who holds the
#: key's lock (`payload.holder`):
#: * nobody any more (the holder ended meanwhile): at once;
#: * a running job of the key's hash: at once too, because claims skip it while that job runs,
#:   and that job's end wakes its queue (dl_wake_lock_waiter);
#: * someone outside dataloader (another service sharing the lock space): after $3 seconds.
#: $4 = worker id.
BACKOFF_JOB: Final = """
WITH holder AS (
    SELECT CASE
        WHEN pg_try_advisory_xact_lock(hashtext(j.lock_key)) THEN 'none'
        WHEN EXISTS (SELECT 1 FROM dl_jobs r
                     WHERE (r.status = 'running') IS TRUE
                       AND hashtext(r.lock_key) = hashtext(j.lock_key) AND r.job_id <> j.job_id)
            THEN 'running job'
        ELSE 'outside dataloader' END AS holder
    FROM dl_jobs j
    WHERE j.job_id = $1 AND j.status::text = 'running' AND j.claim_token = $2
), upd AS (
    UPDATE dl_jobs
    SET status = CASE WHEN cancel_requested THEN 'canceled'::dl_status
                      ELSE 'queued'::dl_status END,
        attempt = attempt - 1,
        available_at = CASE WHEN holder.holder = 'outside dataloader'
                            THEN now() + make_interval(secs => $3::float8) ELSE now() END,
        lease_expires_at = NULL,
        finished_at = CASE WHEN cancel_requested THEN now() END,
        started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END,
        heartbeat_at = CASE WHEN attempt = 1 THEN NULL ELSE heartbeat_at END
    FROM holder
    WHERE job_id = $1 AND status::text = 'running' AND claim_token = $2
    RETURNING job_id, queue, status, attempt + 1 AS claimed_attempt, available_at, holder.holder
)
INSERT INTO dl_job_events (job_id, queue, kind, payload)
SELECT job_id, queue, CASE WHEN status = 'canceled' THEN 'canceled' ELSE 'backoff' END,
       jsonb_build_object('attempt', claimed_attempt, 'worker', $4::text, 'holder', holder,
                          'retry_at', available_at)
FROM upd
RETURNING payload->>'holder' AS holder
"""

# --- workers: while running --------------------------------------------------------------------

#: Extend the leases of many running jobs at once ($1 ids, $2 claim tokens); journal a
#: `heartbeat` for those flagged in $3 (throttled by the caller). Returns the jobs still ours,
#: whether their cancel was requested, and whether their lease was extended. Rows locked by
#: someone else (a pipeline fencing its own writes with FOR SHARE, an operator) are skipped, not
#: waited for: one locked row must not hold up every other lease of the process. Such a job is
#: still ours (it is reported with `extended` false) and is extended at a later beat. A job
#: missing from the answer is no longer ours. FOR NO KEY UPDATE, like the UPDATE itself, does
#: not conflict with the key-share locks of journal inserts.
HEARTBEAT_JOBS: Final = """
WITH mine AS (
    SELECT j.job_id, t.journal FROM dl_jobs j
    JOIN unnest($1::uuid[], $2::uuid[], $3::bool[]) AS t(job_id, claim_token, journal)
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
    SELECT job_id, queue, 'heartbeat', jsonb_build_object('attempt', attempt, 'worker', $4::text)
    FROM beat WHERE journal
)
SELECT job_id, cancel_requested, true AS extended FROM beat
UNION ALL
SELECT j.job_id, j.cancel_requested, false AS extended FROM dl_jobs j
JOIN unnest($1::uuid[], $2::uuid[]) AS t(job_id, claim_token)
  ON j.job_id = t.job_id AND j.claim_token = t.claim_token
WHERE j.status::text = 'running' AND j.job_id NOT IN (SELECT job_id FROM mine)
"""

#: Store a running job's progress. Returns cancel_requested, or no row if the job is not ours.
SET_PROGRESS: Final = """
UPDATE dl_jobs SET progress = $3::jsonb
WHERE job_id = $1 AND status::text = 'running' AND claim_token = $2
RETURNING cancel_requested
"""

# --- workers: finish ---------------------------------------------------------------------------
# Every statement below that takes a job out of `running` calls dl_wake_lock_waiter for it
# (migration 0006): the next job waiting for its lock_key is woken on whichever replica serves
# its queue. Each returns whether that job had waited because of a lock_key collision.

#: Success (spec §6.3) of many jobs at once ($1 ids, $2 their claims' tokens), fenced per job;
#: clears the error text a failed earlier attempt left behind. A row someone else has locked is
#: skipped, not waited for (one locked row must not hold up the batch): it comes back with
#: `busy`, still ours, to be written again. A job missing from the answer is no longer ours.
COMPLETE_JOBS: Final = """
WITH mine AS (
    SELECT j.job_id FROM dl_jobs j
    JOIN unnest($1::uuid[], $2::uuid[]) AS t(job_id, claim_token)
      ON j.job_id = t.job_id AND j.claim_token = t.claim_token
    WHERE j.status::text = 'running'
    FOR NO KEY UPDATE OF j SKIP LOCKED
), upd AS (
    UPDATE dl_jobs j
    SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL, error = NULL
    FROM mine WHERE j.job_id = mine.job_id
    RETURNING j.job_id, j.queue, j.attempt, j.lock_key
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'done', jsonb_build_object('attempt', attempt, 'worker', $3::text)
    FROM upd
), woken AS (
    SELECT u.job_id,
           dl_lock_waiter_found(u.job_id, u.lock_key, u.queue, w.job_id, w.queue, w.lock_key)
               AS collision
    FROM upd u
    CROSS JOIN LATERAL (
        SELECT q.job_id, q.queue, q.lock_key FROM dl_jobs q
        WHERE q.status = 'queued' AND hashtext(q.lock_key) = hashtext(u.lock_key)
          AND q.available_at <= now() AND q.job_id <> u.job_id
        ORDER BY q.priority, q.created_at
        LIMIT 1
    ) AS w
)
SELECT u.job_id, COALESCE(woken.collision, false) AS collision, false AS busy
FROM upd u LEFT JOIN woken ON woken.job_id = u.job_id
UNION ALL
SELECT j.job_id, false, true FROM dl_jobs j
JOIN unnest($1::uuid[], $2::uuid[]) AS t(job_id, claim_token)
  ON j.job_id = t.job_id AND j.claim_token = t.claim_token
WHERE j.status::text = 'running' AND j.job_id NOT IN (SELECT job_id FROM mine)
"""

#: Failure (spec §6.3), fenced: retry after $5 x attempt seconds while attempts remain and the
#: error is retryable ($4), else `failed`; a job whose cancel was requested ends `canceled`.
FAIL_JOB: Final = """
WITH upd AS (
    UPDATE dl_jobs
    SET status = CASE WHEN cancel_requested THEN 'canceled'::dl_status
                      WHEN $4 AND attempt < max_attempts THEN 'queued'::dl_status
                      ELSE 'failed'::dl_status END,
        available_at = CASE WHEN NOT cancel_requested AND $4 AND attempt < max_attempts
                            THEN now() + make_interval(secs => $5::float8 * attempt)
                            ELSE now() END,
        error = $3,
        lease_expires_at = NULL,
        finished_at = CASE WHEN NOT cancel_requested AND $4 AND attempt < max_attempts
                           THEN NULL ELSE now() END
    WHERE job_id = $1 AND status::text = 'running' AND claim_token = $2
    RETURNING job_id, queue, status, attempt, available_at, lock_key
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue,
           CASE status WHEN 'queued' THEN 'requeue' WHEN 'canceled' THEN 'canceled'
                       ELSE 'failed' END,
           jsonb_build_object('attempt', attempt, 'worker', $6::text, 'error', $3::text,
                              'reason', 'error', 'retry_at', CASE WHEN status = 'queued'
                                                              THEN available_at END)
    FROM upd
)
SELECT CASE status WHEN 'queued' THEN 'requeue' WHEN 'canceled' THEN 'canceled'
                   ELSE 'failed' END AS kind,
       dl_wake_lock_waiter(job_id, lock_key, queue) AS collision
FROM upd
"""

#: The pipeline stopped on a cancel request: `canceled`, fenced.
CANCEL_RUNNING_JOB: Final = """
WITH upd AS (
    UPDATE dl_jobs
    SET status = 'canceled', finished_at = now(), lease_expires_at = NULL
    WHERE job_id = $1 AND status::text = 'running' AND claim_token = $2
    RETURNING job_id, queue, attempt, lock_key
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue, 'canceled', jsonb_build_object('attempt', attempt, 'worker', $3::text)
    FROM upd
)
SELECT 'canceled' AS kind, dl_wake_lock_waiter(job_id, lock_key, queue) AS collision FROM upd
"""

#: Hand a running job back to the queue, fenced. $3 = refund the attempt (the run was cut short
#: by the worker's side: its shutdown, its lost advisory lock, its lease it could not extend),
#: honoured while the job has had fewer than $6 refunded hand-backs, so that a job that keeps
#: bringing its process down still consumes its attempts. Without a refund, a job on its last
#: attempt is `lost`. $5 = reason for the journal.
RELEASE_JOB: Final = """
WITH cur AS (
    SELECT job_id, cancel_requested, ($3 AND handbacks < $6) AS refund,
           ($3 AND handbacks < $6) OR attempt < max_attempts AS requeue
    FROM dl_jobs
    WHERE job_id = $1 AND status::text = 'running' AND claim_token = $2
    FOR NO KEY UPDATE
), upd AS (
    UPDATE dl_jobs j
    SET status = CASE WHEN cur.cancel_requested THEN 'canceled'::dl_status
                      WHEN cur.requeue THEN 'queued'::dl_status
                      ELSE 'lost'::dl_status END,
        attempt = CASE WHEN cur.refund THEN j.attempt - 1 ELSE j.attempt END,
        handbacks = j.handbacks + cur.refund::int,
        available_at = now(),
        lease_expires_at = NULL,
        finished_at = CASE WHEN cur.cancel_requested OR NOT cur.requeue THEN now() END,
        error = CASE WHEN NOT cur.cancel_requested AND NOT cur.requeue THEN $5 ELSE j.error END
    FROM cur
    WHERE j.job_id = cur.job_id
    RETURNING j.job_id, j.queue, j.status, j.attempt, j.lock_key, cur.refund
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue,
           CASE status WHEN 'queued' THEN 'requeue' WHEN 'canceled' THEN 'canceled'
                       ELSE 'lost' END,
           jsonb_build_object('attempt', attempt, 'worker', $4::text, 'reason', $5::text,
                              'refunded', refund)
    FROM upd
)
SELECT CASE status WHEN 'queued' THEN 'requeue' WHEN 'canceled' THEN 'canceled'
                   ELSE 'lost' END AS kind,
       dl_wake_lock_waiter(job_id, lock_key, queue) AS collision
FROM upd
"""

# --- reaper --------------------------------------------------------------------------------

#: Expired leases (spec §6.5), at most $1 per call: back to `queued`, or `lost` when the lease
#: expired on the last attempt, or `canceled` when cancel was requested. $2 = reaper id.
REAP_EXPIRED: Final = """
WITH expired AS (
    SELECT job_id FROM dl_jobs
    WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE dl_jobs j
    SET status = CASE WHEN j.cancel_requested THEN 'canceled'::dl_status
                      WHEN j.attempt < j.max_attempts THEN 'queued'::dl_status
                      ELSE 'lost'::dl_status END,
        available_at = now(),
        lease_expires_at = NULL,
        finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts
                           THEN now() END,
        error = CASE WHEN NOT j.cancel_requested AND j.attempt >= j.max_attempts
                     THEN 'lease expired on the last attempt' ELSE j.error END
    FROM expired
    WHERE j.job_id = expired.job_id
    RETURNING j.job_id, j.queue, j.status, j.attempt, j.lock_key
), ev AS (
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    SELECT job_id, queue,
           CASE status WHEN 'queued' THEN 'requeue' WHEN 'canceled' THEN 'canceled' ELSE 'lost' END,
           jsonb_build_object('attempt', attempt, 'reaper', $2::text, 'reason', 'lease expired')
    FROM upd
)
SELECT job_id, status::text AS status, dl_wake_lock_waiter(job_id, lock_key, NULL) AS collision
FROM upd
"""

# --- advisory locks (on the lock-holding connection) --------------------------------------------

#: Try the session-level advisory locks of several lock_key hashes (`hashtext(lock_key)`, the
#: spec's key space) in one round trip.
TRY_ADVISORY_LOCKS: Final = """
SELECT h AS lock_hash, pg_try_advisory_lock(h) AS locked FROM unnest($1::bigint[]) AS h
"""

#: Release session-level advisory locks, one level per hash.
ADVISORY_UNLOCK: Final = (
    "SELECT count(*) FILTER (WHERE pg_advisory_unlock(h)) FROM unnest($1::bigint[]) AS h"
)

#: Release one level of each hash this session holds; returns the hashes released (a lock taken
#: twice by the session needs two releases).
ADVISORY_UNLOCK_HELD: Final = """
SELECT h AS lock_hash FROM unnest($1::bigint[]) AS h WHERE pg_advisory_unlock(h)
"""

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
END_SESSION: Final = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2
"""

#: Liveness probe of a dedicated connection.
PING: Final = "SELECT 1"

# --- live workers (presence) ----------------------------------------------------------------

#: Record this process ($1 worker id, $2 host, $3 pid, $4 version, $5 {queue: concurrency},
#: $6 task names, $7 refresh period in seconds) or refresh its row; the same statement prunes
#: rows of other processes not seen for $8 seconds (processes that died without deregistering).
#: A process whose row was pruned while it was frozen comes back at its next refresh.
UPSERT_WORKER: Final = """
WITH pruned AS (
    DELETE FROM dl_workers
    WHERE seen_at < now() - make_interval(secs => $8::float8) AND worker_id <> $1
)
INSERT INTO dl_workers (worker_id, host, pid, version, queues, tasks, period_sec)
VALUES ($1, $2, $3, $4, $5::text::jsonb, $6::text[], $7)
ON CONFLICT (worker_id) DO UPDATE
SET queues = EXCLUDED.queues, tasks = EXCLUDED.tasks, period_sec = EXCLUDED.period_sec,
    seen_at = now()
"""

#: A clean stop: this process serves nothing any more.
DELETE_WORKER: Final = "DELETE FROM dl_workers WHERE worker_id = $1"

#: Live processes (refreshed within three of their own periods, on the database's clock: one
#: late refresh is no death), with how long ago each was seen.
LIVE_WORKERS: Final = """
SELECT worker_id, host, pid, version, queues::text AS queues, tasks, started_at,
       EXTRACT(EPOCH FROM now() - seen_at)::float8 AS seen_ago_sec
FROM dl_workers
WHERE seen_at > now() - make_interval(secs => 3 * period_sec)
ORDER BY worker_id
"""

#: The task names live processes know (LIVE_WORKERS's liveness).
LIVE_TASKS: Final = """
SELECT DISTINCT unnest(tasks) AS task FROM dl_workers
WHERE seen_at > now() - make_interval(secs => 3 * period_sec)
ORDER BY task
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

# --- migrations ----------------------------------------------------------------------------

#: Serialises migrations across replicas: a session-level lock in the two-key space of advisory
#: locks, which never meets the one-key space of jobs' `hashtext(lock_key)` (a user's lock_key
#: that hashes like our name cannot block migrations, nor be blocked by them). Keys: a class
#: number of dataloader's own internal locks (0x646c6f6b, "dlok" in ASCII), then the lock's.
MIGRATION_LOCK: Final = "SELECT pg_advisory_lock(1684828011, 1)"
MIGRATION_UNLOCK: Final = "SELECT pg_advisory_unlock(1684828011, 1)"

CREATE_MIGRATIONS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS dl_schema_migrations (
    version int PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    adopted boolean NOT NULL DEFAULT false
)
"""

APPLIED_MIGRATIONS: Final = "SELECT version FROM dl_schema_migrations ORDER BY version"

RECORD_MIGRATION: Final = """
INSERT INTO dl_schema_migrations (version, name, adopted) VALUES ($1, $2, $3)
"""

#: Which of the spec's objects already exist (a database the customer prepared by hand).
SPEC_OBJECTS_PRESENT: Final = """
SELECT to_regclass('dl_jobs') IS NOT NULL AS jobs,
       to_regclass('dl_job_events') IS NOT NULL AS events,
       to_regtype('dl_status') IS NOT NULL AS status_type
"""
