-- Running jobs are looked up in two ways, and the planner must not be able to mix them up.
--
-- The spec's ix_dl_jobs_status_queue serves any `status = 'running'` condition. When the
-- statistics were taken while few jobs ran (an idle queue, a fresh table, a long history of
-- finished jobs) it looks as cheap as the right index, and the planner picks it: every probe
-- of a lock_key, and every fenced write of one job, then reads every running job (measured:
-- 0.4 ms instead of 0.01 ms for one fenced write with 3,000 jobs running; a claim of 10 jobs
-- 2.8 ms instead of 0.9 ms). The statements therefore write the running test in forms that
-- index cannot serve:
-- * the lock_key probe as `(status = 'running') IS TRUE`, matched by this index alone;
-- * writes that find their row by primary key as `status::text = 'running'`, which no index
--   serves, so the primary key is the only way in.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_running_key
    ON dl_jobs (lock_key) WHERE (status = 'running') IS TRUE;

-- Replaced by the index above (0002 created it; the spec's indexes are untouched).
DROP INDEX IF EXISTS ix_dl_jobs_running_lock_key;
