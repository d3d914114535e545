"""Side by side with LangGraph's Agent Server (part of `make bench`): the same
workloads, one client, against turnmesh (REST/SSE through Envoy) and against
LangGraph's in-memory Agent Server (`langgraph dev`, pinned below, in a venv of
its own under ~/.cache/turnmesh-bench, made on the first run and kept),
serving bench/peer_graphs: an echo graph and a paced graph equivalent to
turnmesh's echo agent.

Workloads, per level the sides interleaved (turnmesh, peer, turnmesh, peer
... one round each at a time), each side the same count of turns:
  echo    C kept sessions (threads), each a loop of echo turns of 5 words:
          turns/s, turn p50/p99 (request to the end of the stream), CPU per turn
  paced   S streams, each a turn of 40 words, one every 40 ms, streamed as
          tokens: the gap between words beyond the agent's own 40 ms (p50,
          p99), first word p50/p99, words/s, failed turns, CPU per word
CPU from /proc: turnmesh's server, worker and Envoy; the peer's whole process
tree. Next to them the machine's speed (the bare grpc.aio baseline's turns/s
at concurrency 16, bench/suite.py). The client is bench/paced_client.py
(aiohttp on uvloop), a process per run.

The peer runs with --n-jobs-per-worker above the largest level (its default
of 10 concurrent runs would measure its queue) and --allow-blocking, a new
server for each level (--keep-peer: one for all; it slows with the runs it
holds); its run queue adds about a second to each run's start in this mode
(docs/performance.md).

Writes bench/results/peers-<stamp>.json and .md. Loopback only, bounded; ends
only the processes it started, by PID.

Usage: python -m bench.peers [--echo 16 64] [--paced 50 250 500] [--rounds 2]
                             [--keep-peer] [--no-peer] [--smoke]
       (--smoke: turnmesh's side only, tiny)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.paced import BASELINE_EVENTS_PER_TURN, run_client
from bench.suite import RESULTS, Bench, cpu_seconds, percentile, tree_cpu_seconds, tree_pids

PEER_PINS = ("langgraph-cli[inmem]==0.4.40", "langgraph-api==0.16.7")
PEER_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "turnmesh-bench"
    / "langgraph-cli-0.4.40-api-0.16.7"
)
# Reported with each run: the pins and what they brought.
PEER_PACKAGES = ("langgraph-cli", "langgraph-api", "langgraph-runtime-inmem", "langgraph")
VERSIONS = (
    "import importlib.metadata as m, sys;"
    " print(', '.join(n + ' ' + m.version(n) for n in sys.argv[1:]))"
)
GRAPHS = Path(__file__).resolve().parent / "peer_graphs"
# The peer's own telemetry off: the machine has no way out, and it is not the
# work measured.
PEER_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
}
PEER_START_S = 180.0
ECHO_WORDS = 5


@dataclass
class Row:
    side: str
    workload: str
    level: int  # sessions (echo) or streams (paced) at once
    turns: int
    turns_per_s: float
    turn_p50_ms: float
    turn_p99_ms: float
    words_per_s: float
    added_gap_p50_ms: float
    added_gap_p99_ms: float
    first_word_p50_ms: float
    first_word_p99_ms: float
    failed: dict[str, int]
    cpu_ms_per_turn: dict[str, float]
    cpu_ms_per_word: dict[str, float]
    client_cpu_share: float


@dataclass
class PeersReport:
    machine: str
    started: str
    peer: str = ""  # its packages' versions
    baseline_turns_per_s: float = 0.0
    baseline_cpu_ms_per_message: float = 0.0
    words: int = 40
    delay_ms: int = 40
    peer_jobs_per_worker: int = 0
    peer_per_level: bool = True  # a new peer server for each level (not --keep-peer)
    rows: list[Row] = field(default_factory=list)


@dataclass
class Side:
    """A server under test, as the client and the CPU meter see it."""

    name: str
    kind: str  # bench/paced_client.py's --kind
    target: str
    cpu: Callable[[], dict[str, float]]  # CPU seconds so far, per process
    sessions: Callable[[int], Awaitable[list[str]]]


def peer_executable() -> Path:
    """The pinned `langgraph` CLI, installed into its own venv on first use."""
    exe = PEER_VENV / "bin" / "langgraph"
    stamp = PEER_VENV / ".installed"
    if exe.exists() and stamp.exists() and stamp.read_text() == "\n".join(PEER_PINS):
        return exe
    print(f"installing {' '.join(PEER_PINS)} into {PEER_VENV}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_VENV)], check=True)
    pip = [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--disable-pip-version-check", *PEER_PINS], check=True)
    stamp.write_text("\n".join(PEER_PINS))
    return exe


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def peer_versions(exe: Path) -> str:
    """The peer's packages as installed: the pins and what they brought."""
    command = [str(exe.parent / "python"), "-c", VERSIONS, *PEER_PACKAGES, "langchain-core"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Peer:
    """`langgraph dev` serving bench/peer_graphs on a loopback port."""

    def __init__(self, workdir: Path, jobs: int) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        workdir.mkdir(parents=True)
        self.log = (workdir / "langgraph.log").open("wb")
        # A copy in the run's own folder: `langgraph dev` saves its state beside
        # the graphs and loads it at start, and every run starts empty.
        graphs = workdir / "peer_graphs"
        shutil.copytree(GRAPHS, graphs, ignore=shutil.ignore_patterns(".*", "__pycache__"))
        self.proc = subprocess.Popen(
            [
                str(peer_executable()),
                "dev",
                *("--no-browser", "--no-reload", "--allow-blocking"),
                *("--n-jobs-per-worker", str(jobs), "--server-log-level", "WARNING"),
                *("--host", "127.0.0.1", "--port", self.address.split(":")[1]),
            ],
            cwd=graphs,
            env={**os.environ, **PEER_ENV},
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + PEER_START_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"langgraph dev did not start: see {self.log.name}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/ok", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def cpu(self) -> dict[str, float]:
        return {"langgraph": tree_cpu_seconds(self.proc.pid)}

    async def threads(self, count: int) -> list[str]:
        import aiohttp

        async with aiohttp.ClientSession(f"http://{self.address}") as http:

            async def thread() -> str:
                async with http.post("/threads", json={}) as response:
                    response.raise_for_status()
                    thread_id: str = (await response.json())["thread_id"]
                    return thread_id

            return [await thread() for _ in range(count)]

    def stop(self) -> None:
        """SIGTERM to every process of the tree it started, by PID; then SIGKILL."""
        members = tree_pids(self.proc.pid) if self.proc.poll() is None else []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
            if self.proc.poll() is not None and not any(map(alive, members)):
                break
        self.log.close()


def turnmesh_side(bench: Bench) -> Side:
    pids = {
        "server": bench.server.pid,
        "worker": bench.worker.pid,
        "envoy": bench.envoy.proc.pid,
    }
    return Side(
        "turnmesh",
        "rest",
        bench.envoy.listener_address,
        lambda: {name: cpu_seconds(pid) for name, pid in pids.items()},
        bench.sessions,
    )


def peer_side(peer: Peer) -> Side:
    return Side("langgraph", "langgraph", peer.address, peer.cpu, peer.threads)


async def measure(
    sides: list[Side], workload: str, level: int, args: argparse.Namespace, workdir: Path
) -> list[Row]:
    """``args.rounds`` rounds of ``level`` conversations on each side in turn,
    each conversation a loop of ``turns`` turns; one row per side."""
    echo = workload == "echo"
    words, delay_ms = (ECHO_WORDS, 0) if echo else (args.words, args.delay_ms)
    turns = args.echo_turns if echo else args.paced_turns
    merged: dict[str, dict[str, Any]] = {}
    files: dict[str, Path] = {}
    for side in sides:
        files[side.name] = workdir / f"{side.name}-{workload}-{level}.txt"
        files[side.name].write_text("\n".join(await side.sessions(level)))
        merged[side.name] = {"failed": Counter(), "cpu": Counter(), "wall_s": 0.0, "cpu_s": 0.0}
    for _ in range(args.rounds):
        for side in sides:
            before = side.cpu()
            result = await run_client(
                side.kind, side.target, files[side.name], turns, words, delay_ms, workload
            )
            after = side.cpu()
            into = merged[side.name]
            into["cpu"].update({name: after[name] - before[name] for name in after})
            into["failed"].update(result["failed"])
            for key in ("wall_s", "cpu_s", "turns", "words"):
                into[key] = into.get(key, 0) + result[key]
            for key in ("added_gap_ms", "first_word_ms", "end_ms"):
                into.setdefault(key, []).extend(result[key])
    rows = []
    for side in sides:
        got = merged[side.name]
        done, said = max(1, got["turns"]), max(1, got["words"])
        cpu = dict(got["cpu"])
        rows.append(
            Row(
                side=side.name,
                workload=workload,
                level=level,
                turns=got["turns"],
                turns_per_s=round(got["turns"] / got["wall_s"], 1),
                turn_p50_ms=round(percentile(got["end_ms"], 0.5), 1),
                turn_p99_ms=round(percentile(got["end_ms"], 0.99), 1),
                words_per_s=round(got["words"] / got["wall_s"], 1),
                added_gap_p50_ms=round(percentile(got["added_gap_ms"], 0.5), 1),
                added_gap_p99_ms=round(percentile(got["added_gap_ms"], 0.99), 1),
                first_word_p50_ms=round(percentile(got["first_word_ms"], 0.5), 1),
                first_word_p99_ms=round(percentile(got["first_word_ms"], 0.99), 1),
                failed=dict(got["failed"]),
                cpu_ms_per_turn={k: round(v * 1000 / done, 3) for k, v in cpu.items()},
                cpu_ms_per_word={k: round(v * 1000 / said, 4) for k, v in cpu.items()},
                client_cpu_share=round(got["cpu_s"] / got["wall_s"], 3),
            )
        )
    return rows


async def run(args: argparse.Namespace, workdir: Path) -> PeersReport:
    jobs = max([*args.echo, *args.paced]) * 2
    report = PeersReport(
        machine=f"{os.cpu_count()} CPUs, {os.uname().machine}",
        started=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        words=args.words,
        delay_ms=args.delay_ms,
        peer_jobs_per_worker=jobs if args.peer else 0,
        peer_per_level=not args.keep_peer,
    )
    bench = Bench(workdir, turns=0, smoke=args.smoke)
    bench.start()
    peer = None
    try:
        if not args.smoke:  # bench/paced.py's smoke run covers the baseline
            speed = await bench.grpc_cell("baseline", 16, 4000, [])
            report.baseline_turns_per_s = round(speed.turns_per_s, 1)
            report.baseline_cpu_ms_per_message = round(
                speed.cpu_ms_per_turn.get("baseline", 0.0) / BASELINE_EVENTS_PER_TURN, 4
            )
        tm = turnmesh_side(bench)
        if args.peer:
            report.peer = peer_versions(peer_executable())
        # Warm-up, not reported: a side's first runs of both graphs.
        warm = argparse.Namespace(**{**vars(args), "rounds": 1, "echo_turns": 2, "paced_turns": 1})
        warm_up = () if args.smoke else ("echo", "paced")
        for workload in warm_up:
            await measure([tm], workload, 4, warm, workdir)
        levels = [("echo", n) for n in args.echo] + [("paced", n) for n in args.paced]
        for index, (workload, level) in enumerate(levels):
            sides = [tm]
            if args.peer:
                # A new peer per level unless --keep-peer: its in-memory runtime
                # scans every run it holds, finished ones too, so one server
                # for all levels slows with the runs of the levels before.
                if peer is None or not args.keep_peer:
                    if peer is not None:
                        await asyncio.to_thread(peer.stop)
                    peer = await asyncio.to_thread(Peer, workdir / f"peer-{index}", jobs)
                    for name in warm_up:
                        await measure([peer_side(peer)], name, 4, warm, workdir)
                sides.append(peer_side(peer))
            for row in await measure(sides, workload, level, args, workdir):
                report.rows.append(row)
                print(json.dumps(asdict(row)), flush=True)
    finally:
        if peer is not None:
            await asyncio.to_thread(peer.stop)
        bench.stop()
    return report


def render_markdown(report: PeersReport) -> str:
    lines = [
        f"Machine: {report.machine}; run {report.started}. Machine speed: the bare grpc.aio"
        f" baseline streams {report.baseline_turns_per_s:g} turns/s at concurrency 16, at"
        f" {report.baseline_cpu_ms_per_message:g} ms of CPU per streamed message.",
        "",
        f"Peer: {report.peer or 'none'}; `langgraph dev --n-jobs-per-worker"
        f" {report.peer_jobs_per_worker}`"
        f"{', a new one for each level' if report.peer_per_level else ', one for all levels'}."
        f" Paced turns: {report.words} words, one every"
        f" {report.delay_ms} ms. CPU: turnmesh's server + worker + Envoy; the peer's process"
        " tree.",
        "",
        "| workload | at once | side | turns | turns/s | turn p50 / p99 ms | words/s "
        "| added gap p50 / p99 ms | first word p50 / p99 ms | failed "
        "| CPU ms per turn | CPU ms per word | per process (ms per turn) | client CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report.rows:
        failed = ", ".join(f"{k} {v}" for k, v in row.failed.items()) or "0"
        per = ", ".join(f"{k} {v:.3f}" for k, v in row.cpu_ms_per_turn.items())
        lines.append(
            f"| {row.workload} | {row.level} | {row.side} | {row.turns} | {row.turns_per_s:g} "
            f"| {row.turn_p50_ms:g} / {row.turn_p99_ms:g} | {row.words_per_s:g} "
            f"| {row.added_gap_p50_ms:g} / {row.added_gap_p99_ms:g} "
            f"| {row.first_word_p50_ms:g} / {row.first_word_p99_ms:g} | {failed} "
            f"| {sum(row.cpu_ms_per_turn.values()):.3f} "
            f"| {sum(row.cpu_ms_per_word.values()):.4f} | {per} | {row.client_cpu_share:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--echo", type=int, nargs="+", default=[16, 64], help="sessions at once")
    parser.add_argument("--paced", type=int, nargs="+", default=[50, 250, 500], help="streams")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each side per level")
    parser.add_argument("--echo-turns", type=int, default=4, help="per session and round")
    parser.add_argument("--paced-turns", type=int, default=1, help="per stream and round")
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--delay-ms", type=int, default=40)
    parser.add_argument("--no-peer", dest="peer", action="store_false", help="turnmesh only")
    parser.add_argument("--keep-peer", action="store_true", help="one peer server for all levels")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, turnmesh only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.smoke:
        args.peer, args.echo, args.paced, args.rounds = False, [2], [2], 1
        args.echo_turns, args.words, args.delay_ms = 2, 5, 10
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run(args, Path(tmp)))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"peers-{report.started.replace(':', '')}"
    stem.with_suffix(".json").write_text(json.dumps(asdict(report), indent=2))
    markdown = render_markdown(report)
    stem.with_suffix(".md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
