-- Jobs that need no mutual exclusion: enqueued from the library or the CLI without a lock_key.
-- The spec's lock_key is NOT NULL, so such a job stores a key of dataloader's making (its own
-- job_id, which no other job shares) and is marked here: its claim takes no advisory lock, and
-- its end looks for no job waiting on its key. Every job the spec's API or SQL inserts keeps
-- the default, and with it the spec's protocol.
ALTER TABLE dl_jobs ADD COLUMN IF NOT EXISTS lock_free boolean NOT NULL DEFAULT false;
