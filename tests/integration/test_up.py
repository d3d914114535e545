"""`turnmesh up` (what `make run` starts): one command, a working mesh, a clean stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from turnmesh.client import Client, UnavailableError


def test_up_serves_a_conversation_and_stops_cleanly_on_ctrl_c() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNMESH_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnmesh", "up", "--port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        banner = ""
        for line in proc.stdout:
            if "turnmesh is up" in line:
                banner = line
                break
        match = re.search(r"SessionService on (\S+) ", banner)
        assert match, banner
        address = match.group(1)

        # The sync client, as a script would use it.
        with Client(address) as client:
            sid = client.create_session().session_id
            assert "42" in client.send(sid, "What is 6*7?").text
            assert "6*7" in client.send(sid, "What did I ask first?").text
            assert len(client.history(sid)) == 6

        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert proc.wait(timeout=60) == 0
        with Client(address, timeout=2) as client, pytest.raises(UnavailableError):
            client.create_session()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
