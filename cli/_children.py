"""Child processes of `turnmesh up`: started in their own process group, their
output copied line by line to a log file and to the console with a prefix."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from io import BufferedWriter
from pathlib import Path
from typing import TextIO


class ChildFailed(RuntimeError):
    """A child exited or did not become ready."""


class Child:
    def __init__(
        self,
        name: str,
        argv: list[str],
        run_dir: Path,
        console: TextIO = sys.stdout,
        ready_file: Path | None = None,
        *,
        env: dict[str, str] | None = None,
        append_log: bool = False,
    ) -> None:
        self.name = name
        self.ready_file = ready_file
        self.log_path = run_dir / f"{name}.log"
        self.info: dict[str, object] = {}
        self.started = time.monotonic()
        self.started_at = time.time()
        # A restart appends, so the log keeps why the last one died.
        log = self.log_path.open("ab" if append_log else "wb")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                # Own process group: Ctrl-C reaches only `up`, which stops children in order.
                start_new_session=True,
            )
        except BaseException:
            log.close()
            raise
        self._pump = threading.Thread(
            target=self._copy_output, args=(log, console), name=f"log-{name}", daemon=True
        )
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _copy_output(self, log: BufferedWriter, console: TextIO) -> None:
        assert self.proc.stdout is not None
        prefix = f"{self.name:>10} | "
        with log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                console.write(prefix + line.decode(errors="replace"))
                console.flush()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def is_ready(self) -> bool:
        """The ready file is there (read into ``info``)."""
        assert self.ready_file is not None
        if not self.ready_file.exists():
            return False
        self.info = json.loads(self.ready_file.read_text())
        return True

    def wait_ready(self, deadline: float) -> None:
        while not self.is_ready():
            self.check_alive(deadline)
            time.sleep(0.02)

    def check_alive(self, deadline: float) -> None:
        if not self.running:
            raise ChildFailed(
                f"{self.name} exited with code {self.proc.returncode} while starting "
                f"(log: {self.log_path})"
            )
        if time.monotonic() > deadline:
            raise ChildFailed(f"{self.name} was not ready in time (log: {self.log_path})")

    def terminate(self) -> None:
        if self.running:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.running:
            self.proc.kill()

    def reap(self) -> None:
        """After an exit: end what it left in its process group (a file
        reader, say) so nothing holds its port or its log, and close the pipe."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._close()

    def wait_gone(self, deadline: float) -> None:
        """Wait until the process has exited; SIGKILL it at the deadline."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        self._pump.join(timeout=1)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
