"""The ledger the fault pipeline writes, and the checker run after every scenario.

What the checker asserts (see `Report.violations`):
* every job ended `succeeded` (scenarios give jobs attempts to spare, so nothing may end
  `failed` or `lost`, nor stay `queued`/`running` once the scenario has settled), or in
  another final state the scenario allows (`canceled` where it cancels);
* each job's effect was written exactly once, and every succeeded job of the pipeline has it;
* no two runs of one lock_key overlapped in time (a run killed with its process ends when the
  kill was sent: the process does nothing after it, and its locks are only freed later);
* no advisory lock is held in the database once every job is finished;
* attempts only grow on real executions: each attempt number of a pipeline job either has a
  run in the ledger or was picked by a process the scenario hit with a fault around that time
  (killed before it could start the run, or cut off from the database).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

LEDGER_DDL = """
CREATE TABLE fault_runs (
    run_id uuid PRIMARY KEY,
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    lock_key text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz,
    outcome text
);
CREATE TABLE fault_effects (
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE fault_fenced_out (
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    refused_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


SUCCEEDED = frozenset({"succeeded"})
#: The fault pipeline's task (pipeline.TASK): its jobs write the ledger; other jobs of a
#: scenario (a durable process's tasks) are checked for their final state only.
PIPELINE_TASK = "fault.work"
#: A pick without a run is explained by a fault that hit its process at most this long after
#: it (the run could not start) or before it (the claim's answer was lost on the way back,
#: while the process was cut off and had not noticed yet).
PICKED_BEFORE_FAULT = dt.timedelta(seconds=10)
PICKED_AFTER_FAULT = dt.timedelta(seconds=30)


@dataclass
class Report:
    """What one scenario did and what went wrong (every count after `runs` must be 0)."""

    scenario: str
    rounds: int
    jobs: int
    runs: int
    recovered_in_s: float
    fenced_out_writes: int
    unexpected_states: dict[str, int] = field(default_factory=dict)
    duplicate_effects: int = 0
    missing_effects: int = 0
    overlaps: list[str] = field(default_factory=list)
    leftover_advisory_locks: int = 0
    unexplained_attempts: list[str] = field(default_factory=list)
    #: What the scenario measured besides (latencies, recovery times), by name.
    figures: dict[str, Any] = field(default_factory=dict)

    def violations(self) -> list[str]:
        found = []
        if self.unexpected_states:
            found.append(f"jobs in unexpected states: {self.unexpected_states}")
        if self.duplicate_effects:
            found.append(f"{self.duplicate_effects} job(s) with more than one effect")
        if self.missing_effects:
            found.append(f"{self.missing_effects} succeeded job(s) without their effect")
        if self.overlaps:
            found.append(f"overlapping runs of one lock_key: {self.overlaps[:5]}")
        if self.leftover_advisory_locks:
            found.append(f"{self.leftover_advisory_locks} advisory lock(s) left behind")
        if self.unexplained_attempts:
            found.append(f"attempts without a run: {self.unexplained_attempts[:5]}")
        return found

    def as_json(self) -> str:
        return json.dumps(asdict(self))


async def install(conn: asyncpg.Connection) -> None:
    await conn.execute(LEDGER_DDL)


async def unsettled(conn: asyncpg.Connection) -> int:
    """Jobs not yet in a final state."""
    n: int = await conn.fetchval(
        "SELECT count(*) FROM dl_jobs WHERE status IN ('queued', 'running')"
    )
    return n


async def check(
    conn: asyncpg.Connection,
    scenario: str,
    *,
    rounds: int,
    recovered_in_s: float,
    killed_at: dict[int, dt.datetime],
    faults: list[tuple[int, dt.datetime]],
    final: frozenset[str] = SUCCEEDED,
) -> Report:
    """Build the report of a settled scenario. `killed_at`: pid → when it was killed;
    `faults`: (pid, when) of every fault that hit a process (killed, stopped, cut off);
    `final`: the states jobs may end in."""
    counts = {
        r["status"]: r["n"]
        for r in await conn.fetch(
            "SELECT status::text AS status, count(*) AS n FROM dl_jobs GROUP BY 1"
        )
    }
    report = Report(
        scenario=scenario,
        rounds=rounds,
        jobs=sum(counts.values()),
        runs=await conn.fetchval("SELECT count(*) FROM fault_runs"),
        recovered_in_s=round(recovered_in_s, 2),
        fenced_out_writes=await conn.fetchval("SELECT count(*) FROM fault_fenced_out"),
        unexpected_states={k: v for k, v in counts.items() if k not in final},
    )
    report.duplicate_effects = await conn.fetchval(
        "SELECT count(*) FROM (SELECT job_id FROM fault_effects GROUP BY job_id"
        " HAVING count(*) > 1) d"
    )
    report.missing_effects = await conn.fetchval(
        "SELECT count(*) FROM dl_jobs j WHERE status = 'succeeded' AND task = $1"
        " AND NOT EXISTS (SELECT 1 FROM fault_effects e WHERE e.job_id = j.job_id)",
        PIPELINE_TASK,
    )
    report.overlaps = await _overlaps(conn, killed_at)
    report.leftover_advisory_locks = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    report.unexplained_attempts = await _unexplained_attempts(conn, faults)
    return report


async def most_running_at_once(conn: asyncpg.Connection) -> int:
    """The most runs of the ledger under way at one moment (what a queue limit bounds); a
    run's end and another's start at one instant do not count as together."""
    most: int | None = await conn.fetchval(
        """
        SELECT max(under_way) FROM (
            SELECT sum(change) OVER (ORDER BY at, change) AS under_way FROM (
                SELECT started_at AS at, 1 AS change FROM fault_runs
                UNION ALL
                SELECT ended_at, -1 FROM fault_runs WHERE ended_at IS NOT NULL
            ) AS changes
        ) AS counts
        """
    )
    return most or 0


async def _overlaps(conn: asyncpg.Connection, killed_at: dict[int, dt.datetime]) -> list[str]:
    rows = await conn.fetch(
        "SELECT lock_key, job_id, attempt, pid, started_at, ended_at, outcome FROM fault_runs"
        " ORDER BY lock_key, started_at"
    )
    found: list[str] = []
    previous: dict[str, tuple[Any, dt.datetime | None]] = {}
    for row in rows:
        end = row["ended_at"] or killed_at.get(row["pid"])
        before = previous.get(row["lock_key"])
        if before is not None:
            earlier, earlier_end = before
            if earlier_end is None or earlier_end > row["started_at"]:
                how = earlier["outcome"] or ("killed" if earlier_end else "never ended")
                found.append(
                    f"{row['lock_key']}: {earlier['job_id']}#{earlier['attempt']} (pid "
                    f"{earlier['pid']}, {how}) until {earlier_end} and {row['job_id']}#"
                    f"{row['attempt']} (pid {row['pid']}) from {row['started_at']}"
                )
        previous[row["lock_key"]] = (row, end)
    return found


async def _unexplained_attempts(
    conn: asyncpg.Connection, faults: list[tuple[int, dt.datetime]]
) -> list[str]:
    """Attempt numbers a job reached without a run in the ledger, unless a fault hit the
    process that picked them around the time it did."""
    rows = await conn.fetch(
        """
        SELECT j.job_id, n AS attempt, p.worker, p.picked_at
        FROM dl_jobs j CROSS JOIN generate_series(1, j.attempt) AS n
        LEFT JOIN LATERAL (
            SELECT e.payload->>'worker' AS worker, e.ts AS picked_at FROM dl_job_events e
            WHERE e.job_id = j.job_id AND e.kind = 'picked' AND (e.payload->>'attempt')::int = n
            ORDER BY e.event_id DESC LIMIT 1) p ON true
        WHERE j.task = $1
          AND NOT EXISTS (SELECT 1 FROM fault_runs r WHERE r.job_id = j.job_id AND r.attempt = n)
        """,
        PIPELINE_TASK,
    )
    return [
        f"{r['job_id']}#{r['attempt']} picked by {r['worker']}"
        for r in rows
        if not _near_a_fault(_pid_of(r["worker"]), r["picked_at"], faults)
    ]


def _near_a_fault(
    pid: int | None, picked_at: dt.datetime | None, faults: list[tuple[int, dt.datetime]]
) -> bool:
    """Whether a fault hit `pid` shortly after it picked the job (before it could start the
    run) or shortly before (a claim answered while it was cut off, lost on the way back)."""
    return picked_at is not None and any(
        hit_pid == pid and -PICKED_BEFORE_FAULT <= picked_at - hit_at <= PICKED_AFTER_FAULT
        for hit_pid, hit_at in faults
    )


def _pid_of(worker_id: str | None) -> int | None:
    """The pid inside a worker id `host-pid-random`."""
    if not worker_id:
        return None
    parts = worker_id.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
