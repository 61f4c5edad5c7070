"""The traceback a failed attempt keeps in its journal entry: as the log shows it, secrets
masked, its end kept when it is long."""

from __future__ import annotations

from dataloader.workers.executor import MAX_TRACEBACK_CHARS, traceback_text


def raised(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:
        return caught


def test_a_traceback_names_the_frames_and_masks_secrets() -> None:
    text = traceback_text(raised(ValueError("login postgresql://etl:hunter2@db/x failed")))
    assert text.startswith("Traceback (most recent call last):")
    assert "in raised" in text
    assert text.endswith("ValueError: login postgresql://etl:***@db/x failed")


def test_a_long_traceback_keeps_its_end() -> None:
    text = traceback_text(raised(RuntimeError("x" * 40_000 + " the end")))
    assert len(text) == MAX_TRACEBACK_CHARS
    assert text.startswith("…")
    assert text.endswith(" the end")


def test_a_traceback_is_storable() -> None:
    text = traceback_text(raised(ValueError("NUL \x00 and half an emoji \ud83d")))
    assert text.endswith("ValueError: NUL \\x00 and half an emoji \\ud83d")
