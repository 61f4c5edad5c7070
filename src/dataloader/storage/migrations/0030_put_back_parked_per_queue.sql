-- A job parked behind its lock_key goes back into its queue's claim order when no job of the key
-- runs, whatever waits in other queues. Until now the end of a key's running job put back only
-- the key's next due job across every queue: when that job sat in a queue nobody claims (paused,
-- limited to the full, or served by no process), the key's parked jobs of the other queues stayed
-- parked for as long as it waited, and the reaper's sweep, which looked for keys with no job
-- running nor ready, did not release them either. A claim takes a key's first job of its own
-- queue once nothing of the key runs, parked or not: so, when a key is freed, the first job
-- parked behind it in each queue goes back (the next due job's queue excepted, which that job
-- heads), and the sweep looks at each queue of a key apart.

-- The jobs parked behind a running key, by key hash and queue in claim order: the first parked
-- job of each queue of a key, one probe per queue (it replaces 0009's index of the hash alone,
-- which served the sweep and the `waiting` counts, and serves them still).
DROP INDEX IF EXISTS ix_dl_jobs_parked_lock_hash;
CREATE INDEX ix_dl_jobs_parked_lock_hash
    ON dl_jobs (hashtext(lock_key), queue, priority, created_at, job_id)
    WHERE status = 'queued' AND parked = 'lock_key';

-- Called by an end that frees a key and does not hand its next job to a worker: waits for the
-- inserts that may be parking behind the key (they hold the key's parking lock shared until
-- they commit: 0029), then, in snapshots taken after that lock, if no job of the key runs, puts
-- back the first job parked behind the key in each queue but `except_queue` (the queue of the
-- next job the end itself put back or woke: NULL, none), unless a job of the key due and not
-- parked comes before it in that queue (it runs first, and its end looks again), and wakes each
-- queue concerned. A job
-- another session holds is left as it is (the reaper's sweep puts it back). The lock is held
-- until the end commits, so an insert that comes later parks nothing until then, and then sees
-- the job ended. Returns the queue of a job put back (NULL: none).
CREATE OR REPLACE FUNCTION dl_put_back_parked(freed_key text, except_queue text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    lock_hash integer := hashtext(freed_key);
    first_parked record;
    put_back_to text;
    any_put_back text;
BEGIN
    PERFORM pg_advisory_xact_lock(1684828013, lock_hash);
    IF EXISTS (
        SELECT 1 FROM dl_jobs r
        WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = lock_hash
          AND NOT r.lock_free
    ) THEN
        RETURN NULL;
    END IF;
    -- the first parked job of the key's first queue, then of each queue after it: one probe
    -- of ix_dl_jobs_parked_lock_hash per queue
    SELECT p.job_id, p.queue, p.priority, p.created_at INTO first_parked FROM dl_jobs p
    WHERE p.status = 'queued' AND p.parked = 'lock_key' AND hashtext(p.lock_key) = lock_hash
    ORDER BY hashtext(p.lock_key), p.queue, p.priority, p.created_at, p.job_id
    LIMIT 1;
    WHILE FOUND LOOP
        -- a job of the key ready ahead of it in its queue: by ix_dl_jobs_queued_lock_hash,
        -- the key's jobs before it in claim order (of every queue: those ahead are few)
        IF first_parked.queue IS DISTINCT FROM except_queue AND NOT EXISTS (
            SELECT 1 FROM dl_jobs r
            WHERE r.status = 'queued' AND hashtext(r.lock_key) = lock_hash AND NOT r.lock_free
              AND (r.priority, r.created_at, r.job_id)
                  < (first_parked.priority, first_parked.created_at, first_parked.job_id)
              AND r.queue = first_parked.queue AND r.parked IS NULL
              AND (r.available_at <= clock_timestamp()) IS TRUE
        ) THEN
            UPDATE dl_jobs q SET parked = NULL
            FROM (SELECT l.job_id FROM dl_jobs l
                  WHERE l.job_id = first_parked.job_id AND l.status = 'queued'
                    AND l.parked = 'lock_key'
                  FOR NO KEY UPDATE SKIP LOCKED) AS locked
            WHERE q.job_id = locked.job_id
            RETURNING q.queue INTO put_back_to;
            IF put_back_to IS NOT NULL THEN
                PERFORM pg_notify('dl_jobs', put_back_to);
                any_put_back := COALESCE(any_put_back, put_back_to);
            END IF;
        END IF;
        SELECT p.job_id, p.queue, p.priority, p.created_at INTO first_parked FROM dl_jobs p
        WHERE p.status = 'queued' AND p.parked = 'lock_key' AND hashtext(p.lock_key) = lock_hash
          AND p.queue > first_parked.queue
        ORDER BY hashtext(p.lock_key), p.queue, p.priority, p.created_at, p.job_id
        LIMIT 1;
    END LOOP;
    RETURN any_put_back;
END
$$;

-- 0029's look-again (processes of that version call it when their end's snapshot held no next
-- job of the key): now every queue's first parked job.
CREATE OR REPLACE FUNCTION dl_parked_unseen(freed_key text) RETURNS text
LANGUAGE sql AS $$
    SELECT dl_put_back_parked(freed_key, NULL)
$$;
