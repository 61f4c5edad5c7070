-- Listing jobs newest first (GET /api/v1/jobs, Client.list) from an index: a page of 100 took
-- 100-700 ms beside 1,000,000 finished jobs (a sort of the whole table), 0.1-5 ms with these.
-- The order, and the keyset of the next page, are (created_at, job_id), walked backwards.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_created ON dl_jobs (created_at, job_id);

-- Every job of a lock_key, finished ones included. A hash: a lock_key may be longer than a
-- btree entry can hold.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_lock_key_hash ON dl_jobs (hashtext(lock_key));
