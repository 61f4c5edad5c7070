-- Removed processes by their id, newest incarnation first: a caller who repeats a keyed call
-- (its answer was lost) to a process removed since, by that very call or later, gets that
-- call's response, which its idempotency key finds only through the incarnation it named
-- (`storage.processes.REMOVED_FACTS`). Entries are bounded as ux_dl_processes_live's are, and
-- leave with the rows retention prunes.
CREATE INDEX IF NOT EXISTS ix_dl_processes_removed_id
    ON dl_processes (namespace, process_id, process_ref) WHERE removed_at IS NOT NULL;
