"""No index holds text that can outgrow a btree entry.

A btree entry holds at most ~2,700 bytes. An index that holds a text, JSON or other
variable-length value taken as it was given fails the write of a longer one; when only some rows
enter it (running jobs, say), that write is a claim, and every later claim of the queue fails.
So every variable-length value an index of dataloader's tables stores (key or INCLUDE column)
must be bounded in bytes where it comes in, far enough below that size; anything else is
indexed by its hash (`hashtext(…)`, a 4-byte integer) and tested on the rows the hash finds.
This test reads every index of the migrated schema and names any that breaks the rule.
"""

from __future__ import annotations

import socket

import asyncpg

from dataloader.api import SESSION_SECRET_NAME
from dataloader.core import limits
from dataloader.core.processes import NAMESPACE_MAX_BYTES, PROCESS_ID_MAX_BYTES
from dataloader.core.queues import THROUGHPUT_KINDS
from dataloader.maintenance.leader import MAINTENANCE_LEASE

#: What an index entry may hold of variable-length values, all together (its headers and the
#: fixed-size columns beside them take the rest of the ~2,700 bytes).
ENTRY_BUDGET_BYTES = 2600

#: Longest host name (Linux's HOST_NAME_MAX), and the longest pid and random part of a
#: worker's id (`host-pid-hex`).
HOST_NAME_MAX_BYTES = 64
WORKER_ID_MAX_BYTES = HOST_NAME_MAX_BYTES + len("-4194304-") + 6
#: Names of dataloader's own making (a lease, a maintenance loop, a throughput kind): a word.
OWN_NAME_MAX_BYTES = 32

#: Variable-length columns an index may hold, each with the byte bound that makes it safe: the
#: check that refuses anything longer where the value comes in, or why no longer value exists.
BOUNDED: dict[tuple[str, str], int] = {
    # queue and task names: core.limits.check_name, for every producer, the HTTP API, the
    # queue settings (pause, limits) and DL_CRON alike
    ("dl_jobs", "queue"): limits.NAME_MAX_BYTES,
    ("dl_jobs", "task"): limits.NAME_MAX_BYTES,
    ("dl_queues", "queue"): limits.NAME_MAX_BYTES,
    ("dl_queue_events", "queue"): limits.NAME_MAX_BYTES,
    ("dl_queue_throughput", "queue"): limits.NAME_MAX_BYTES,
    # a schedule's name (DL_CRON's `name` is checked as a name)
    ("dl_cron", "name"): limits.NAME_MAX_BYTES,
    # the spec's unique idempotency_key: core.limits.check_idempotency_key
    ("dl_jobs", "idempotency_key"): limits.IDEMPOTENCY_KEY_MAX_BYTES,
    # the parent's id in a stage's idempotency_key: 36 characters at most, whatever they are
    ("dl_jobs", "substr(idempotency_key, 7, 36)"): 36 * limits.UTF8_MAX_BYTES_PER_CHAR,
    # a process's namespace and id: core.processes.check_namespace and check_process_id
    ("dl_processes", "namespace"): NAMESPACE_MAX_BYTES,
    ("dl_processes", "process_id"): PROCESS_ID_MAX_BYTES,
    # written by dataloader only
    ("dl_processes", "status"): OWN_NAME_MAX_BYTES,
    ("dl_workers", "worker_id"): WORKER_ID_MAX_BYTES,
    ("dl_leases", "name"): OWN_NAME_MAX_BYTES,
    ("dl_secrets", "name"): OWN_NAME_MAX_BYTES,
    ("dl_maintenance_runs", "task"): OWN_NAME_MAX_BYTES,
    ("dl_queue_throughput", "kind"): OWN_NAME_MAX_BYTES,
}

#: Each value an index of dataloader's tables stores: its index, table, position, what it
#: is (a column's name or an expression) and whether its type has a variable length.
INDEXED_VALUES = """
SELECT i.relname AS index, t.relname AS "table", a.attnum AS position,
       pg_get_indexdef(x.indexrelid, a.attnum, true) AS value,
       format_type(a.atttypid, a.atttypmod) AS type, ty.typlen < 0 AS variable
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace AND n.nspname = current_schema()
JOIN pg_attribute a ON a.attrelid = x.indexrelid
JOIN pg_type ty ON ty.oid = a.atttypid
WHERE t.relname LIKE 'dl\\_%'
ORDER BY i.relname, a.attnum
"""


async def test_every_indexed_text_is_bounded_in_bytes_or_hashed(conn: asyncpg.Connection) -> None:
    rows = await conn.fetch(INDEXED_VALUES)
    assert {r["index"] for r in rows} >= {
        "ix_dl_jobs_claim",
        "ix_dl_jobs_running_lock_hash",
        "dl_jobs_idempotency_key_key",
    }  # the query sees the schema
    unbounded = [
        f"{r['index']}: {r['value']} ({r['type']}) of {r['table']}"
        for r in rows
        if r["variable"] and (r["table"], r["value"]) not in BOUNDED
    ]
    assert not unbounded, "index variable-length values by hash, or bound them in bytes"
    per_index: dict[str, int] = {}
    for r in rows:
        if r["variable"]:
            per_index[r["index"]] = per_index.get(r["index"], 0) + BOUNDED[r["table"], r["value"]]
    too_wide = {index: size for index, size in per_index.items() if size > ENTRY_BUDGET_BYTES}
    assert not too_wide, too_wide


def test_the_bounds_of_dataloaders_own_names_hold() -> None:
    """The bounds above of values dataloader writes itself are those of what it writes."""
    assert len(socket.gethostname().encode()) <= HOST_NAME_MAX_BYTES
    own = [
        MAINTENANCE_LEASE,
        "reaper",
        "pruner",
        "cron",
        SESSION_SECRET_NAME,
        *THROUGHPUT_KINDS.values(),
    ]
    assert max(len(name.encode()) for name in own) <= OWN_NAME_MAX_BYTES
