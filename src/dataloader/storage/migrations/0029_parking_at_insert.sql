-- A job enqueued while a job of its lock_key runs can go in parked behind it (queries.INSERT_JOB:
-- Parking at insert), so that no claim walks it. The end of the running job looks for its key's
-- next job in the snapshot its statement began with, which holds no job inserted after that.
-- Inserts and ends meet on a lock of the key (a class of dataloader's two-key locks of its own),
-- each looking at the other's rows in a snapshot taken after the lock, as only a function's own
-- queries can within one statement.

-- Whether an insert may park its jobs of the lock_key hash `lock_hash` behind a running job:
-- it takes the key's parking lock shared (held until the insert commits), unless an end holds
-- it (then nothing is parked), and a job of the key runs now.
CREATE OR REPLACE FUNCTION dl_park_behind(lock_hash integer) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1684828013, lock_hash) THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM dl_jobs r
        WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = lock_hash
          AND NOT r.lock_free
    );
END
$$;

-- Called by an end that frees a key and did not write its key's next job (its snapshot held
-- none, or another session held it): waits for the inserts that may be parking behind the key
-- (they hold the lock shared until they commit), then looks again, due by the clock (not by the
-- start of the end's transaction, which an insert begun later is after): if the key's next due
-- job is parked and no job of the key runs now, that job goes back into the claim's order and
-- its queue is woken. The lock is held until the end commits, so an insert that comes later
-- parks nothing until then, and then sees the job ended. A next job another session holds is
-- left as it is (the reaper's sweep of stranded jobs puts it back). Returns the queue of the
-- job put back.
CREATE OR REPLACE FUNCTION dl_parked_unseen(freed_key text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    waiter record;
    put_back_to text;
BEGIN
    PERFORM pg_advisory_xact_lock(1684828013, hashtext(freed_key));
    SELECT q.job_id, q.parked INTO waiter
    FROM dl_jobs q
    WHERE q.status = 'queued' AND hashtext(q.lock_key) = hashtext(freed_key)
      AND NOT q.lock_free AND (q.available_at <= clock_timestamp()) IS TRUE
    ORDER BY q.priority, q.created_at, q.job_id
    LIMIT 1;
    IF NOT FOUND OR waiter.parked IS DISTINCT FROM 'lock_key' OR EXISTS (
        SELECT 1 FROM dl_jobs r
        WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = hashtext(freed_key)
          AND NOT r.lock_free
    ) THEN
        RETURN NULL;
    END IF;
    UPDATE dl_jobs q SET parked = NULL
    FROM (SELECT l.job_id FROM dl_jobs l
          WHERE l.job_id = waiter.job_id AND l.status = 'queued' AND l.parked = 'lock_key'
          FOR NO KEY UPDATE SKIP LOCKED) AS locked
    WHERE q.job_id = locked.job_id
    RETURNING q.queue INTO put_back_to;
    IF put_back_to IS NOT NULL THEN
        PERFORM pg_notify('dl_jobs', put_back_to);
    END IF;
    RETURN put_back_to;
END
$$;
