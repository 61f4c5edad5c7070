-- A job's row has three versions (queued, running, ended), and each state change writes every
-- index anew. The job list's indexes now leave out the running version: the claim, which
-- writes it, costs them no entry, and a finished job keeps two entries in each, not three.
-- The list reads the jobs running at the moment (few: at most the workers' slots) through the
-- indexes of running jobs, and the others through these; each index keeps its name. The
-- index of lock keys keeps every version: with a condition a queued job meets, the planner
-- could take it for the search of a freed key's next job, which must read only queued jobs
-- (the key's finished ones may be millions).
DROP INDEX IF EXISTS ix_dl_jobs_created;
CREATE INDEX ix_dl_jobs_created ON dl_jobs (created_at, job_id) WHERE status <> 'running';

DROP INDEX IF EXISTS ix_dl_jobs_task_created;
CREATE INDEX ix_dl_jobs_task_created ON dl_jobs (task, created_at, job_id)
    WHERE status <> 'running';

DROP INDEX IF EXISTS ix_dl_jobs_partition_created;
CREATE INDEX ix_dl_jobs_partition_created
    ON dl_jobs (hashtext(partition_key), created_at, job_id)
    WHERE partition_key <> '' AND status <> 'running';

DROP INDEX IF EXISTS ix_dl_jobs_args;
CREATE INDEX ix_dl_jobs_args ON dl_jobs USING gin (args jsonb_path_ops)
    WHERE args <> '{}'::jsonb AND status <> 'running';
