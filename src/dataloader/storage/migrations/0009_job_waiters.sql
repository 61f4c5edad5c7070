-- Jobs a client waits for (Client.wait). A job's end is announced on `dl_job_finished` only
-- when someone waits for it: PostgreSQL wakes every listening session of the database for
-- each notification, whatever its channel, so announcing every end would wake each worker's
-- listener once per batch of outcomes. The outcome statement deletes the row it announces;
-- a row whose waiter gave up goes with the job's end, or with the job.
CREATE TABLE IF NOT EXISTS dl_job_waiters (
    job_id uuid PRIMARY KEY REFERENCES dl_jobs (job_id) ON DELETE CASCADE,
    since timestamptz NOT NULL DEFAULT now()
);
