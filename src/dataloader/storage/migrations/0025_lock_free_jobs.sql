-- Jobs that need no mutual exclusion: enqueued from the library or the CLI without a lock_key.
-- The spec's lock_key is NOT NULL, so such a job stores a key of dataloader's making (the empty
-- string, which no caller can give) and is marked here: its claim takes no advisory lock and
-- looks for no running job of its key, and its end for no job waiting on it. Every job the
-- spec's API or SQL inserts keeps the default, and with it the spec's protocol.
ALTER TABLE dl_jobs ADD COLUMN IF NOT EXISTS lock_free boolean NOT NULL DEFAULT false;
