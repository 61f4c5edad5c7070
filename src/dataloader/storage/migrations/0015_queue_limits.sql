-- Limits of a queue across every replica: running jobs at most (in the queue, and per
-- partition_key), and claims per second (a token bucket: `tokens` left at `tokens_at`). NULL: no
-- limit. Claims of a queue with limits take a transaction-level advisory lock of the queue, so
-- that replicas count and claim one after another.
ALTER TABLE dl_queues
    ADD COLUMN IF NOT EXISTS max_running int CHECK (max_running > 0),
    ADD COLUMN IF NOT EXISTS max_running_per_partition int
        CHECK (max_running_per_partition > 0),
    ADD COLUMN IF NOT EXISTS max_per_second float8 CHECK (max_per_second > 0),
    ADD COLUMN IF NOT EXISTS tokens float8,
    ADD COLUMN IF NOT EXISTS tokens_at timestamptz;

-- The running jobs of each partition_key of a queue (only running rows enter it).
CREATE INDEX IF NOT EXISTS ix_dl_jobs_running_partition ON dl_jobs (queue, partition_key)
    WHERE status = 'running';
