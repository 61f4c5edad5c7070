"""The end-of-run check finds a process the run started, also one that is not its child."""

from __future__ import annotations

import subprocess
import sys

from tests import leftovers


def test_a_process_started_during_the_run_is_found_until_it_ends() -> None:
    # a grandchild, as the postmaster is: its parent exits at once
    spawner = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys;"
            "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " stdout=subprocess.DEVNULL).pid)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    orphan = int(spawner.stdout)
    found = [proc for proc in leftovers.left_behind() if proc.pid == orphan]
    assert len(found) == 1
    assert "time.sleep(120)" in leftovers.describe(found[0])
    leftovers.end(found)
    assert orphan not in {proc.pid for proc in leftovers.left_behind()}
