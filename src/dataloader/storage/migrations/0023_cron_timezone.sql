-- The time zone a schedule is read in, beside it: the dashboard shows each schedule's next
-- slot, which depends on it (a schedule recorded before this one reads in UTC, the default).
ALTER TABLE dl_cron ADD COLUMN IF NOT EXISTS timezone text NOT NULL DEFAULT 'UTC';
