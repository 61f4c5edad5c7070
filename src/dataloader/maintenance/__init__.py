"""Maintenance that one process runs for all: the reaper (expired leases), the pruner (old
finished jobs) and the cron scheduler (periodic tasks). Every process running workers bids
for one lease (`leader.Leadership`); the one holding it runs them (`runner.Maintenance`), and
another takes over within `DL_LEADER_LEASE_SEC` of its death. Each of them stays correct if
two processes ever run it at once (a leader frozen past its lease): the reaper's writes are
fenced, the pruner's deletes skip locked rows, and each cron slot has one idempotency key."""
