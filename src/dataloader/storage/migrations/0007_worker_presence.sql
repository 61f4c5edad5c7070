-- Live workers: each process records which queues and tasks it serves, and refreshes its row
-- every DL_PRESENCE_PERIOD_SEC. A process is live while `seen_at` is within three of its own
-- periods of the database's clock; a clean stop deletes its row, and rows not refreshed for an
-- hour are pruned by the live processes. The API refuses a trigger naming a task that no live
-- process knows, and /status warns of a queue with ready jobs that no live process serves.
CREATE TABLE IF NOT EXISTS dl_workers (
    worker_id text PRIMARY KEY,              -- host-pid-random, as in the journal's `worker`
    host text NOT NULL,
    pid int NOT NULL,
    version text NOT NULL,                   -- dataloader's package version
    queues jsonb NOT NULL DEFAULT '{}'::jsonb,  -- {queue: concurrency}
    tasks text[] NOT NULL DEFAULT '{}',      -- task names the process can run
    period_sec float8 NOT NULL CHECK (period_sec > 0),
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now()
);
