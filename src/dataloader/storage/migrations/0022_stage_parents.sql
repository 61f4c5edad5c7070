-- A job's stages (the jobs its success enqueued), found from their idempotency_key, which
-- names their parent (`stage:<job_id>:<claim_token>:<n>`): only stage jobs enter this index,
-- each by the 36 characters of its parent's id.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_stage_parent ON dl_jobs (substr(idempotency_key, 7, 36))
    WHERE idempotency_key LIKE 'stage:%';
