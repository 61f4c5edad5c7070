-- Durable processes: long-lived state machines whose tasks are jobs of dl_jobs.
--
-- A process is one row of dl_processes; its history is dl_process_events. Its tasks (init,
-- call, repair, timeout, remove) are ordinary jobs, whose lock_key is the process's own: the
-- queue's mutual exclusion runs them one at a time, and their lease, retries, journal and
-- metrics are every job's. A process's incarnation is `process_ref`: a removed process keeps
-- its row (with `removed_at`) and its events until retention prunes them, and its id may be
-- started anew as another incarnation at once.
CREATE TABLE IF NOT EXISTS dl_processes (
    process_ref bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace text NOT NULL,
    process_id text NOT NULL,
    -- the queue its tasks are jobs of (its namespace's, when it was started)
    queue text NOT NULL,
    status text NOT NULL DEFAULT 'init',
    detail text,
    aux_state jsonb,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- the task (job) whose failure or death put the process in `error`
    corrupted_by uuid,
    -- the init task's args: a start of a taken id is compared with them
    init_args jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- the number of events in the history (the last event's id)
    last_event_id bigint NOT NULL DEFAULT 0,
    -- the pending timer: its task (a queued job), kind and due time
    timer_task uuid,
    timer_kind text,
    timer_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    removed_at timestamptz,
    CONSTRAINT dl_processes_chk_status CHECK (status IN ('init', 'running', 'error')),
    CONSTRAINT dl_processes_chk_timer CHECK (
        (timer_task IS NULL) = (timer_kind IS NULL) AND (timer_kind IS NULL) = (timer_at IS NULL)
        AND (timer_kind IS NULL OR timer_kind IN ('timeout', 'remove'))
    )
) WITH (fillfactor = 80);  -- every step updates its process: room for HOT updates

-- One live process per id; namespace and process_id are bounded in bytes where they come in
-- (800 and 1,600), so that their entry fits a btree page.
CREATE UNIQUE INDEX IF NOT EXISTS ux_dl_processes_live
    ON dl_processes (namespace, process_id) WHERE removed_at IS NULL;
-- Lists by namespace (and status), in keyset pages; counts by status at each scrape.
CREATE INDEX IF NOT EXISTS ix_dl_processes_list
    ON dl_processes (namespace, status, process_ref) WHERE removed_at IS NULL;
-- Processes in error, for /status and the list filtered by status alone.
CREATE INDEX IF NOT EXISTS ix_dl_processes_status
    ON dl_processes (status, process_ref) WHERE removed_at IS NULL;
-- Removed processes, oldest first, for retention.
CREATE INDEX IF NOT EXISTS ix_dl_processes_removed
    ON dl_processes (removed_at) WHERE removed_at IS NOT NULL;

-- The history: append-only, numbered 1, 2, 3… per process without gaps (the step that
-- appends them holds its process row's lock). No foreign key: retention deletes the events of
-- a removed process in batches, before its row.
CREATE TABLE IF NOT EXISTS dl_process_events (
    process_ref bigint NOT NULL,
    event_id bigint NOT NULL,
    task_id uuid NOT NULL,
    ts timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL,
    metadata jsonb,
    PRIMARY KEY (process_ref, event_id)
);
