"""The messages of the library's refusals."""

from __future__ import annotations

from dataloader.exceptions import SHOWN_TASKS, UnknownTask


def test_an_unknown_task_names_the_known_ones_sorted_and_counts_the_rest() -> None:
    known = [f"etl.t{i:02d}" for i in reversed(range(SHOWN_TASKS + 5))]
    message = str(UnknownTask("etl.typo", known, "etl"))
    shown = ", ".join(f"etl.t{i:02d}" for i in range(SHOWN_TASKS))
    assert f"'etl.typo' is unknown (known: {shown} and 5 more)" in message
    assert "live processes serve queue 'etl'" in message
    assert "DL_ALLOW_UNKNOWN_TASKS=true" in message


def test_an_unknown_task_says_when_no_live_process_knows_any() -> None:
    assert "(no live process knows any task)" in str(UnknownTask("etl.load", (), "etl"))
