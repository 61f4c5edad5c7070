-- Lists of one task's or one partition_key's jobs, newest first, from an index: without one, a
-- rare task walked every job newest first looking for matches (seconds beside 10,000,000
-- finished jobs, and all of them for a task that has none). Each holds the list's order and
-- keyset, (created_at, job_id), after the value filtered on.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_task_created ON dl_jobs (task, created_at, job_id);

-- A partition_key may be longer than a btree entry can hold: the index holds its hash, and
-- the list tests the text itself on the rows the hash finds. Jobs without a partition_key
-- (''), the default, are left out: they cost their writes nothing here.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_partition_created
    ON dl_jobs (hashtext(partition_key), created_at, job_id) WHERE partition_key <> '';
