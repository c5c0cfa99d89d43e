"""The examples run as a user runs them."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_tool.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_agent_tool_sends_once_when_called_twice(tmp_path):
    url = f"sqlite:{tmp_path / 'tools.db'}"
    first = _run(url)
    assert "emails sent by this process: 1" in first
    lines = first.splitlines()
    assert lines[0].removeprefix("first:  ") == lines[1].removeprefix("second: ")
    # The agent restarted: the same step is answered, nothing is sent.
    again = _run(url)
    assert "emails sent by this process: 0" in again
    assert again.splitlines()[0] == lines[0]
