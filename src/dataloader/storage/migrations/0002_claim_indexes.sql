-- Claim in (priority, created_at) order straight from an index: the spec's ix_dl_jobs_claim
-- leads with available_at, so with a large backlog every claim sorted all ready rows.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_claim_order
    ON dl_jobs (queue, priority, created_at) WHERE status = 'queued';

-- The claim skips jobs whose lock_key is already running (no backoff storm on busy keys).
CREATE INDEX IF NOT EXISTS ix_dl_jobs_running_lock_key
    ON dl_jobs (lock_key) WHERE status = 'running';

-- Journal reads by job, and ON DELETE CASCADE from dl_jobs.
CREATE INDEX IF NOT EXISTS ix_dl_job_events_job ON dl_job_events (job_id, event_id);
