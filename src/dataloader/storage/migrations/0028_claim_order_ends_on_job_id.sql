-- Claim order is (priority, created_at), and jobs enqueued in one call share their created_at.
-- Among those, the indexes of the claim and of a key's next job ordered by the row's place in
-- the table, which a parking or a put back changes (a row updated so is written anew,
-- elsewhere): the jobs of one key enqueued together could run out of the order they were
-- given. Claim order now ends on job_id, which dataloader's clients make increasing within a
-- process (version 7 UUIDs with a counter in the same millisecond), and both indexes with it.
DROP INDEX IF EXISTS ix_dl_jobs_claim_ready;
CREATE INDEX ix_dl_jobs_claim_ready ON dl_jobs (queue, priority, created_at, job_id)
    WHERE status = 'queued' AND parked IS NULL;

DROP INDEX IF EXISTS ix_dl_jobs_queued_lock_hash;
CREATE INDEX ix_dl_jobs_queued_lock_hash
    ON dl_jobs (hashtext(lock_key), priority, created_at, job_id)
    WHERE status = 'queued' AND NOT lock_free;

-- 0026's wake-up of a freed key's next job (processes of earlier versions call it), in the
-- same order.
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
    ORDER BY q.priority, q.created_at, q.job_id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN dl_lock_waiter_found(finished, finished_key, finished_queue,
                                waiter.job_id, waiter.queue, waiter.lock_key);
END
$$;
