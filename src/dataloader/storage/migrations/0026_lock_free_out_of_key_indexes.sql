-- A lock_free job (0025) holds no key and waits for none: it stays out of the indexes of lock
-- keys, and its three row versions (queued, running, ended) cost them no entry. Each index
-- keeps its name and serves the same look-ups, every one of which now says `NOT lock_free`.
DROP INDEX IF EXISTS ix_dl_jobs_lock_key_hash;
CREATE INDEX ix_dl_jobs_lock_key_hash ON dl_jobs (hashtext(lock_key)) WHERE NOT lock_free;

DROP INDEX IF EXISTS ix_dl_jobs_queued_lock_hash;
CREATE INDEX ix_dl_jobs_queued_lock_hash ON dl_jobs (hashtext(lock_key), priority, created_at)
    WHERE status = 'queued' AND NOT lock_free;

DROP INDEX IF EXISTS ix_dl_jobs_running_lock_hash;
CREATE INDEX ix_dl_jobs_running_lock_hash ON dl_jobs (hashtext(lock_key))
    WHERE (status = 'running') IS TRUE AND NOT lock_free;

-- 0006's functions, their look-ups in the indexes above with the condition that lets them.
CREATE OR REPLACE FUNCTION dl_lock_waiter_found(
    finished uuid, finished_key text, finished_queue text,
    waiter uuid, waiter_queue text, waiter_key text
) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF finished_queue IS NULL OR waiter_queue <> finished_queue THEN
        PERFORM pg_notify('dl_jobs', waiter_queue);
    END IF;
    IF waiter_key = finished_key OR EXISTS (
        SELECT 1 FROM dl_jobs r
        WHERE (r.status = 'running') IS TRUE AND hashtext(r.lock_key) = hashtext(waiter_key)
          AND NOT r.lock_free AND r.lock_key = waiter_key AND r.job_id <> finished
    ) THEN
        RETURN false;
    END IF;
    INSERT INTO dl_job_events (job_id, queue, kind, payload)
    VALUES (waiter, waiter_queue, 'lock_key_collision',
            jsonb_build_object('waited_for', finished, 'lock_key', finished_key,
                               'lock_hash', hashtext(finished_key)));
    RETURN true;
END
$$;

-- 0006's wake-up of a freed key's next job (processes of earlier versions call it), likewise.
CREATE OR REPLACE FUNCTION dl_wake_lock_waiter(finished uuid, finished_key text, finished_queue text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    waiter record;
BEGIN
    SELECT q.job_id, q.queue, q.lock_key INTO waiter
    FROM dl_jobs q
    WHERE q.status = 'queued' AND hashtext(q.lock_key) = hashtext(finished_key)
      AND NOT q.lock_free AND q.available_at <= now() AND q.job_id <> finished
    ORDER BY q.priority, q.created_at
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN dl_lock_waiter_found(finished, finished_key, finished_queue,
                                waiter.job_id, waiter.queue, waiter.lock_key);
END
$$;
