-- Lock keys, fencing tokens and hand-backs.
--
-- 1. Running jobs are looked up by the hash of their lock_key, not by the key itself. A btree
--    entry is limited to about 2,700 bytes, and lock_key is unbounded text in the spec's DDL: a
--    job whose key is longer (in characters that do not compress) could be inserted, but every
--    later claim of its queue failed to enter it into ix_dl_jobs_running_key. The hash is the
--    value the advisory lock is taken on anyway, so jobs whose keys collide under hashtext are
--    serialised like jobs of one key: they wait in claim order instead of backing off in turn.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_running_lock_hash
    ON dl_jobs (hashtext(lock_key)) WHERE (status = 'running') IS TRUE;
DROP INDEX IF EXISTS ix_dl_jobs_running_key;

-- 2. The next queued job of a lock_key hash, in claim order: when a job ends, the queue of the
--    job waiting for its key is woken, whichever replica serves it.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_queued_lock_hash
    ON dl_jobs (hashtext(lock_key), priority, created_at) WHERE status = 'queued';

-- 3. A fencing token drawn at random by every claim. claim_seq only grows on one server; after a
--    failover to an asynchronous standby that had not received the last claims, the new primary
--    would hand out the same claim_seq again, and a process still running the lost claim could
--    pass the new owner's fence. A token derived from a random UUID the claiming worker draws
--    (its md5 with the row's number in the claim) is never handed out twice.
ALTER TABLE dl_jobs ADD COLUMN IF NOT EXISTS claim_token uuid;

--    During a rolling upgrade, processes of an earlier version still claim by incrementing
--    claim_seq alone: the token of the claim before theirs would stay, and a process of this
--    version still holding that earlier claim (frozen, cut off, its lease reaped) would pass the
--    fence of the newer claim. A claim that leaves the token as it was therefore clears it. The
--    trigger's condition is evaluated without calling a function, so claims of this version,
--    which always draw a new token, pay only that comparison.
CREATE OR REPLACE FUNCTION dl_clear_stale_claim_token() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.claim_token := NULL;
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS dl_jobs_clear_stale_claim_token ON dl_jobs;
CREATE TRIGGER dl_jobs_clear_stale_claim_token
BEFORE UPDATE OF claim_seq ON dl_jobs
FOR EACH ROW
WHEN (NEW.claim_seq IS DISTINCT FROM OLD.claim_seq
      AND NEW.claim_token IS NOT DISTINCT FROM OLD.claim_token)
EXECUTE FUNCTION dl_clear_stale_claim_token();

-- 4. Hand-backs whose attempt was refunded (shutdown, lost advisory lock, lease not extended):
--    bounded, so that a job that keeps bringing its process down consumes its attempts.
ALTER TABLE dl_jobs ADD COLUMN IF NOT EXISTS handbacks int NOT NULL DEFAULT 0;

-- 5. Recent lock_key collisions, for /status.
CREATE INDEX IF NOT EXISTS ix_dl_job_events_lock_collisions
    ON dl_job_events (ts) WHERE kind = 'lock_key_collision';

-- Called for each job that leaves `running` (its lock_key is free): wakes the queue of the next
-- ready job of the same lock_key hash, in claim order, on the spec's channel (any replica
-- serving that queue claims it now, not at its next poll). A waiter in the finished job's own
-- queue is not notified: the worker that ran the job serves that queue and wakes it itself, and
-- waking every replica of the queue at once would only make them race for the key (the reaper,
-- which may not serve the queue, passes NULL: always notified). If that job's key is a different
-- one that only shares the hash, and no job of its own key runs, it waited because of a hashtext
-- collision: journalled on the waiting job (`lock_key_collision`) and reported as true.
-- The batched completion finds the waiter itself (a join, cheaper than a call per job) and
-- calls dl_lock_waiter_found only for the jobs that have one.
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
          AND r.lock_key = waiter_key AND r.job_id <> finished
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

CREATE OR REPLACE FUNCTION dl_wake_lock_waiter(finished uuid, finished_key text, finished_queue text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    waiter record;
BEGIN
    SELECT q.job_id, q.queue, q.lock_key INTO waiter
    FROM dl_jobs q
    WHERE q.status = 'queued' AND hashtext(q.lock_key) = hashtext(finished_key)
      AND q.available_at <= now() AND q.job_id <> finished
    ORDER BY q.priority, q.created_at
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN dl_lock_waiter_found(finished, finished_key, finished_queue,
                                waiter.job_id, waiter.queue, waiter.lock_key);
END
$$;
