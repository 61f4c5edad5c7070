-- The tasks of queued jobs, for /status and the task list to show those no live process knows
-- (their jobs wait for a process that knows them): a skip scan walks one entry per (task,
-- queue). Only queued rows enter it, so a claim leaves it; names are at most 800 bytes each.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_queued_task ON dl_jobs (task, queue) WHERE status = 'queued';
