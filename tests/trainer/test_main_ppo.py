"""The main entry point keeps its command line; until the trainer lands it stops with a clear message."""

from __future__ import annotations

import subprocess
import sys


def test_main_ppo_command_line_stops_with_a_clear_message():
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "trainer.total_epochs=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "trainer is not built yet" in proc.stderr
    assert "trainer.total_epochs=1" in proc.stderr
