-- A task's failed, lost or canceled jobs, newest first (the dashboard's "this task's failures",
-- `GET /api/v1/jobs?task=…&status=failed`): the task's index walks all its jobs for a status
-- none of them has (1.2 s for a task of 500,000 jobs beside 10,000,000). Only jobs that ended
-- so enter this index: a job that succeeds costs its writes nothing here.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_task_ended_badly ON dl_jobs (task, status, created_at, job_id)
    WHERE status IN ('failed', 'lost', 'canceled');
