-- When the current (or last) attempt started: `started_at` keeps the first attempt's start, as
-- the spec's claim sets it, so that a retried job's `duration_ms` (its last attempt's) can be
-- read against the attempt it measures. Nullable, no default: adding it rewrites nothing.
ALTER TABLE dl_jobs ADD COLUMN IF NOT EXISTS attempted_at timestamptz;
