-- What the library keeps of each job's last attempt, and what long jobs and updated jobs need.
-- Columns with constant defaults (or none) are added without rewriting the table.
ALTER TABLE dl_jobs
    -- the task's return value (JSON) when its last attempt succeeded; NULL otherwise
    ADD COLUMN IF NOT EXISTS result jsonb,
    -- how long the last attempt ran, in milliseconds
    ADD COLUMN IF NOT EXISTS duration_ms bigint,
    -- the worker process that made the last claim (host-pid-random, as in the journal)
    ADD COLUMN IF NOT EXISTS worker_id text,
    -- a resumable cursor the task saved (ctx.checkpoint); the next attempt starts from it
    ADD COLUMN IF NOT EXISTS checkpoint jsonb,
    -- enqueued again with the re-run policy while it ran: run once more when it ends
    ADD COLUMN IF NOT EXISTS rerun_requested boolean NOT NULL DEFAULT false;
