"""`turnmesh up` as a subprocess for tests: its console read as it comes (a
test waits for a line, never for a time), its status file, and cleanup of
exactly the processes it started, by PID."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

# Bounds with ample headroom for a loaded 2-core machine: a start takes ~5 s.
LINE_TIMEOUT = 120.0
EXIT_TIMEOUT = 30.0


def clean_env() -> dict[str, str]:
    """This environment without TURNMESH_* settings (a developer's shell may have some)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TURNMESH_")}


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line mentions `text` (a run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


class UpProcess:
    def __init__(self, run_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "turnmesh", "up", "--run-dir", str(run_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=clean_env() if env is None else env,
            start_new_session=True,
        )
        self._lines: dict[str, list[str]] = {"out": [], "err": []}
        self._ended: set[str] = set()
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            with self._changed:
                self._lines[name].append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended.add(name)
            self._changed.notify_all()

    def mark(self, stream: str = "err") -> int:
        """Where the stream is now: wait_line(after=mark) sees only later lines."""
        with self._changed:
            return len(self._lines[stream])

    def wait_line(
        self, pattern: str, *, stream: str = "err", after: int = 0, timeout: float = LINE_TIMEOUT
    ) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self._lines[stream][after:]:
                    if found := regex.search(line):
                        return found
                if stream in self._ended:
                    ended = "".join(self._lines["err"])
                    raise AssertionError(f"`up` ended, no line matches {pattern!r}:\n{ended}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no line matching {pattern!r} in {timeout} s")
                self._changed.wait(remaining)

    def text(self, stream: str = "err") -> str:
        with self._changed:
            return "".join(self._lines[stream])

    def banner(self) -> str:
        self.wait_line(r"^Ctrl-C stops the mesh\.", stream="out")
        out = self.text("out")
        return out[: out.index("Ctrl-C stops the mesh.")]

    def edge(self) -> str:
        found = re.search(r"REST/SSE and gRPC\s+https?://(\S+)", self.banner())
        assert found, self.banner()
        return found.group(1)

    def status(self) -> dict[str, dict[str, Any]]:
        """The status file's components by name."""
        document = json.loads((self.run_dir / "status.json").read_text())
        return {c["name"]: c for c in document["components"]}

    def wait_exit(self, timeout: float = EXIT_TIMEOUT) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=EXIT_TIMEOUT)
        return code

    def close(self) -> None:
        """Stop `up` (it stops its children); if it will not, kill it and
        then each child it listed, by PID."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                for component in self.status().values():
                    if component["pid"]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(component["pid"], signal.SIGKILL)
        for reader in self._readers:
            reader.join(timeout=EXIT_TIMEOUT)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> UpProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
