-- Search of jobs by args (containment, `args @> '{"day": "2026-01-01"}'`) from an index rather
-- than a walk of every job. jsonb_path_ops holds one hash per path to a value, whatever the
-- value's size, so no accepted args is too large for it (a btree entry holds ~2,700 bytes); it
-- answers only `@>`, which is all the list asks. Jobs with empty args ('{}', the default) are
-- left out: a search names at least one key, so it never finds them, and they cost their
-- writes nothing here. Its pending list (fastupdate, on) keeps the writes it takes cheap: each
-- change of a job's status writes a new version of its row, and so of its entries.
CREATE INDEX IF NOT EXISTS ix_dl_jobs_args ON dl_jobs USING gin (args jsonb_path_ops)
    WHERE args <> '{}'::jsonb;
