-- Queued jobs that cannot run now leave the claim's index, so that no claim walks them: with
-- 50,000 jobs of a running lock_key, or 50,000 delayed jobs, ahead in claim order, every claim
-- read them all before it found a job it could run.
--
-- `parked` says why a queued job is out of the claim's way (NULL: it is not):
--   'delayed'   it is not due yet. Jobs are parked so when written with a later available_at
--               (enqueued with a delay, retried after a backoff); a claim of their queue puts
--               back those that have come due.
--   'lock_key'  a job of its lock_key hash runs; a claim that meets it parks it. When that job
--               leaves `running`, the next job of the hash in claim order is put back, and the
--               reaper puts back the first of any hash that has parked jobs and none running.
-- A job written by other means (plain SQL, an older version) is parked, if need be, by the
-- first claim that meets it. The column is only ever a shortcut: a claim still checks that a
-- job is due and that its lock_key is free.
ALTER TABLE dl_jobs ADD COLUMN IF NOT EXISTS parked text;
ALTER TABLE dl_jobs DROP CONSTRAINT IF EXISTS dl_jobs_chk_parked;
ALTER TABLE dl_jobs ADD CONSTRAINT dl_jobs_chk_parked CHECK (parked IN ('delayed', 'lock_key'));

-- The claim's order over the jobs that may run (it replaces ix_dl_jobs_claim_order, which held
-- every queued job).
CREATE INDEX IF NOT EXISTS ix_dl_jobs_claim_ready
    ON dl_jobs (queue, priority, created_at) WHERE status = 'queued' AND parked IS NULL;
DROP INDEX IF EXISTS ix_dl_jobs_claim_order;

-- Delayed jobs by the time they come due, per queue.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_parked_delayed
    ON dl_jobs (queue, available_at) WHERE status = 'queued' AND parked = 'delayed';

-- The hashes that have jobs parked behind a running job (the reaper's check).
CREATE INDEX IF NOT EXISTS ix_dl_jobs_parked_lock_hash
    ON dl_jobs (hashtext(lock_key)) WHERE status = 'queued' AND parked = 'lock_key';

UPDATE dl_jobs SET parked = 'delayed'
WHERE status = 'queued' AND available_at > now() AND parked IS NULL;
