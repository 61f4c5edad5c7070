-- The running jobs of each partition_key of a queue, by the key's hash: 0015's index held the
-- text itself, and a btree entry holds at most ~2,700 bytes, while a partition_key may take
-- 4,000 (1,000 characters of 4 bytes). Such a key was accepted, and from then on every claim of
-- its queue failed as its job entered `running` (and this index). The statements that count a
-- partition's running jobs find them by the hash and test the text itself on the rows found;
-- jobs without a partition_key (''), in no partition, are left out.
DROP INDEX IF EXISTS ix_dl_jobs_running_partition;
CREATE INDEX IF NOT EXISTS ix_dl_jobs_running_partition_hash
    ON dl_jobs (queue, hashtext(partition_key))
    WHERE status = 'running' AND partition_key <> '';
