-- Maintenance that one process runs for all (the reaper, the pruner, the cron scheduler).

-- Leases: the process named `holder` runs what the lease covers until `expires_at`; it
-- renews it well before, and another process takes it once it has expired (its holder died
-- or lost the database). A clean stop deletes its row: the next process takes over at once.
CREATE TABLE IF NOT EXISTS dl_leases (
    name text PRIMARY KEY,
    holder text NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- The last run of each maintenance task, for /status.
CREATE TABLE IF NOT EXISTS dl_maintenance_runs (
    task text PRIMARY KEY,
    holder text NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    ok boolean NOT NULL,
    error text,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    runs bigint NOT NULL DEFAULT 1
);

-- The pruner deletes finished jobs of each status oldest first: this range holds only them.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_finished ON dl_jobs (status, finished_at)
    WHERE finished_at IS NOT NULL;

-- Heartbeat entries are deleted after a while, the oldest first (a long job writes many).
CREATE INDEX IF NOT EXISTS ix_dl_job_events_heartbeats ON dl_job_events (ts)
    WHERE kind = 'heartbeat';

-- Periodic tasks: each declared schedule, and the last time slot enqueued for it. A slot's
-- job is enqueued with the idempotency key `cron:<name>:<slot>`, so two processes that both
-- believe they lead (one frozen past its lease) still enqueue each slot once.
CREATE TABLE IF NOT EXISTS dl_cron (
    name text PRIMARY KEY,
    schedule text NOT NULL,
    task text NOT NULL,
    queue text NOT NULL,
    last_slot timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
