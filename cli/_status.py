"""The state of a running `turnmesh up`, for people and scripts.

`up` rewrites ``status.json`` in its run directory on every change (a child
started, ready, dead, restarted) and prints the same table on SIGUSR1.
``turnmesh status`` reads the file: no signal, no socket, nothing to race
with, and it works for any user who can read the run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
RUNS_DIR = Path(".turnmesh") / "runs"


@dataclass
class ComponentStatus:
    name: str
    pid: int | None
    state: str  # starting, running, restarting, stopping, exited
    restarts: int
    started_at: float | None  # epoch seconds of the current process
    last_exit: str  # "killed by SIGKILL", "exit code 1", or "-"
    address: str
    log: str


def write_status(run_dir: Path, state: str, components: list[ComponentStatus]) -> None:
    document = {
        "pid": os.getpid(),
        "state": state,
        "updated_at": time.time(),
        "components": [asdict(c) for c in components],
    }
    target = run_dir / STATUS_FILE
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=1))
    os.replace(tmp, target)  # a reader never sees half a file


def read_status(run_dir: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((run_dir / STATUS_FILE).read_text())
    return document


def _uptime(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def table(components: list[ComponentStatus], now: float | None = None) -> str:
    now = time.time() if now is None else now
    header = ("component", "pid", "state", "restarts", "uptime", "last exit", "address")
    rows = [header]
    for c in components:
        alive = c.started_at is not None and c.state in ("starting", "running")
        rows.append(
            (
                c.name,
                str(c.pid) if c.pid is not None and alive else "-",
                c.state,
                str(c.restarts),
                _uptime(now - c.started_at) if alive and c.started_at is not None else "-",
                c.last_exit,
                c.address,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, but alive
    return True


def _latest_run_dir() -> Path | None:
    found = sorted(RUNS_DIR.glob(f"*/{STATUS_FILE}"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def run_status(args: argparse.Namespace) -> int:
    run_dir: Path | None = args.run_dir or _latest_run_dir()
    if run_dir is None:
        print(
            f"turnmesh status: no run of `turnmesh up` under {RUNS_DIR}; pass --run-dir DIR",
            file=sys.stderr,
        )
        return 1
    try:
        document = read_status(run_dir)
    except (OSError, ValueError) as exc:
        print(f"turnmesh status: no status in {run_dir} ({exc})", file=sys.stderr)
        return 1
    running = document["state"] != "stopped" and _alive(int(document["pid"]))
    if args.json:
        print(json.dumps({**document, "running": running}, indent=1))
    else:
        components = [ComponentStatus(**c) for c in document["components"]]
        state = document["state"]
        if not running and state != "stopped":
            state = "not running (it died: the table is as it last wrote it)"
        print(f"turnmesh up (pid {document['pid']}) in {run_dir}: {state}")
        print(table(components))
    return 0 if running else 1
