"""When a queue's claim loop next puts back its delayed jobs that have come due.

Delayed jobs are parked out of the claim's order until due (`queries.PUT_BACK_DUE` puts them
back); nothing notifies a worker when one comes due, so each claim says in how many seconds the
queue's earliest delayed job is due by the database's clock, and the loop keeps a timer for it.
The loop's clock and the database's are not the same: a worker that wakes a few milliseconds
before the database's clock reaches the due time finds nothing to put back, and a claim just
after may say the job is due. That job is put back at once, not a retry period later: only due
jobs the put back saw but could not take (another session held them) wait that period, so that
the loop does not spin on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: How long to wait before putting back again delayed jobs that are due but were left parked
#: (another session held them), instead of trying again at once.
DUE_RETRY_SEC: Final = 1.0


@dataclass(frozen=True, slots=True)
class PutBack:
    """What one put back of a queue's come-due delayed jobs did."""

    #: Jobs put back into the claim's order.
    count: int
    #: Seconds until the next delayed job of the queue that is not due yet comes due, by the
    #: database's clock (None: none is parked delayed).
    next_due_in: float | None = None
    #: Due jobs were left parked: another session held them.
    held: bool = False
    #: A whole batch was put back: more may be due already.
    full: bool = False


def next_put_back_at(now: float, put_back: PutBack | None, due_in: float | None) -> float:
    """When (on the loop's monotonic clock) to put back the queue's delayed jobs next, after a
    round whose claim answered at `now`: `put_back` is what the round's put back did (None: it
    ran none, no job being due by the loop's timer), `due_in` what the claim said after it, in
    how many seconds the queue's earliest delayed job is due by the database's clock (at most
    0: one is due and still parked; None: none is parked delayed). The claim took its clock's
    reading before it answered, so `now + due_in` is never before the database's due time: the
    timer wakes the loop when the job can be put back, not a little before."""
    if put_back is not None and put_back.full:
        return now
    if due_in is None:
        return float("inf")
    if due_in > 0:
        return now + due_in
    if put_back is not None and put_back.held:
        return now + DUE_RETRY_SEC  # held elsewhere: not a spin
    return now  # came due since the put back looked: put it back at once
