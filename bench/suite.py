"""The benchmark suite (`make bench`): the mesh against the best one Python gRPC
hop can do, side by side in one run.

Paths, each at every concurrency:
  baseline   a bare grpc.aio server streaming the echo turn's events (bench/baseline.py)
  worker     the echo worker's Run, called directly
  mesh-grpc  SessionService.Turn on a session server (client -> server -> worker)
  mesh-rest  POST /v1/sessions/{id}/turns through Envoy, SSE (driven by wrk)

Further runs: turn latency at history 2, 200 and 2,000; one long turn of 10,000
deltas on each path; memory per idle session; `turnmesh up` time to ready.
Writes bench/results/<stamp>.json, .md and .png. Loopback only, bounded.

Usage: python -m bench.suite [--concurrency 1 16 64] [--turns N] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient
from turnmesh.v1 import message_pb2

RESULTS = Path(__file__).resolve().parent / "results"
MESSAGE = "one two three four five"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every process descended from it that is alive now, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], ()))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU so far of a process and its live descendants (a peer server's workers)."""
    total = 0.0
    for member in tree_pids(pid):
        with contextlib.suppress(OSError):  # exited meanwhile
            total += cpu_seconds(member)
    return total


def rss_bytes(pid: int) -> int:
    """A process's resident memory now, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Cell:
    path: str
    concurrency: int
    turns: int
    turns_per_s: float
    p50_ms: float
    p99_ms: float
    ttfe_p50_ms: float | None
    ttfe_p99_ms: float | None
    cpu_ms_per_turn: dict[str, float]
    loadgen_cpu_share: float  # of one core, over the run
    ratio: float = 0.0


@dataclass
class Report:
    machine: str
    started: str
    cells: list[Cell] = field(default_factory=list)
    history: dict[str, float] = field(default_factory=dict)
    long_turn_events_per_s: dict[str, float] = field(default_factory=dict)
    memory_per_idle_session_bytes: float = 0.0
    up_seconds: float = 0.0


class Bench:
    def __init__(
        self, workdir: Path, turns: int, smoke: bool, server_args: tuple[str, ...] = ()
    ) -> None:
        self.workdir = workdir
        self.turns = turns
        self.smoke = smoke
        self.server_args = server_args
        self.mesh = Mesh(workdir / "mesh")

    def start(self) -> None:
        mesh = self.mesh
        self.router = mesh.start_router()
        self.worker = mesh.spawn_worker("worker", "echo")
        # Room for the memory run's sessions (the default limit is 100,000).
        self.server = mesh.spawn_server(
            "server", "--log-level", "WARNING", "--max-sessions", "10000000", *self.server_args
        )
        mesh.wait_ready(self.worker, self.server)
        self.envoy = mesh.start_envoy([self.server])
        ready = self.workdir / "baseline.json"
        self.baseline_proc = subprocess.Popen(
            [sys.executable, "-m", "bench.baseline", "--ready-file", str(ready)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not ready.exists():
            if time.monotonic() > deadline or self.baseline_proc.poll() is not None:
                raise RuntimeError("the baseline server did not start")
            time.sleep(0.02)
        self.baseline_address = json.loads(ready.read_text())["address"]

    def stop(self) -> None:
        if self.baseline_proc.poll() is None:
            self.baseline_proc.terminate()
            self.baseline_proc.wait(timeout=10)
        self.mesh.stop()

    def pids(self) -> dict[str, int]:
        return {
            "baseline": self.baseline_proc.pid,
            "worker": self.worker.pid,
            "server": self.server.pid,
            "router": self.router.pid,
            "envoy": self.envoy.proc.pid,
        }

    async def sessions(self, count: int, history: int = 0) -> list[str]:
        seed = [
            message_pb2.Message(
                role="user" if i % 2 == 0 else "assistant", content=f"m{i} {MESSAGE}"
            )
            for i in range(history)
        ]
        async with AsyncClient(self.server.address) as client:
            return [
                (await client.create_session(agent="echo", messages=seed)).session_id
                for _ in range(count)
            ]

    # gRPC paths --------------------------------------------------------------------

    async def grpc_cell(self, path: str, concurrency: int, turns: int, sessions: list[str]) -> Cell:
        target, kind = {
            "baseline": (self.baseline_address, "run"),
            "worker": (self.worker.address, "run"),
            "mesh-grpc": (self.server.address, "turn"),
        }[path]
        processes = min(4, concurrency)
        per_process = max(1, concurrency // processes)
        before = {name: cpu_seconds(pid) for name, pid in self.pids().items()}
        procs = []
        for p in range(processes):
            mine = sessions[p * per_process : (p + 1) * per_process] if sessions else []
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.loadgen",
                    "--target",
                    target,
                    "--kind",
                    kind,
                    "--concurrency",
                    str(per_process),
                    "--turns",
                    str(turns // processes),
                    "--sessions",
                    ",".join(mine),
                    "--message",
                    MESSAGE,
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        outputs = [json.loads((await proc.communicate())[0]) for proc in procs]
        after = {name: cpu_seconds(pid) for name, pid in self.pids().items()}
        latencies = [x for o in outputs for x in o["latency_ms"]]
        firsts = [x for o in outputs for x in o["first_event_ms"]]
        wall = max(o["wall_s"] for o in outputs)
        done = len(latencies)
        cpu = {name: (after[name] - before[name]) * 1000 / done for name in before}
        cpu["loadgen"] = sum(o["cpu_s"] for o in outputs) * 1000 / done
        return Cell(
            path,
            concurrency,
            done,
            done / wall,
            percentile(latencies, 0.5),
            percentile(latencies, 0.99),
            percentile(firsts, 0.5),
            percentile(firsts, 0.99),
            {k: round(v, 3) for k, v in cpu.items() if v > 0.0005},
            max(o["cpu_s"] / o["wall_s"] for o in outputs),
        )

    # REST path (wrk) ------------------------------------------------------------------

    def rest_cell(self, concurrency: int, sessions: list[str], seconds: float) -> Cell:
        script = self.workdir / "turn.lua"
        script.write_text(WRK_SCRIPT)
        threads = min(2, concurrency)
        before = {name: cpu_seconds(pid) for name, pid in self.pids().items()}
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        result = subprocess.run(
            [
                "wrk",
                "-t",
                str(threads),
                "-c",
                str(concurrency),
                "-d",
                f"{max(1, round(seconds))}s",
                "--latency",
                "-s",
                str(script),
                f"http://{self.envoy.listener_address}",
                "--",
                ",".join(sessions),
                MESSAGE,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=True,
        )
        wall = time.monotonic() - started
        after = {name: cpu_seconds(pid) for name, pid in self.pids().items()}
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        wrk_cpu = (children_after.ru_utime - children_before.ru_utime) + (
            children_after.ru_stime - children_before.ru_stime
        )
        match = re.search(r"TURNMESH (\{.*\})", result.stdout)
        assert match, result.stdout + result.stderr
        stats = json.loads(match.group(1))
        if stats["errors"] or stats["non2xx"]:
            raise RuntimeError(f"wrk saw errors: {stats}")
        done = stats["requests"]
        cpu = {name: (after[name] - before[name]) * 1000 / done for name in before}
        cpu["loadgen"] = wrk_cpu * 1000 / done
        return Cell(
            "mesh-rest",
            concurrency,
            done,
            done / (stats["duration_us"] / 1e6),
            stats["p50_us"] / 1000,
            stats["p99_us"] / 1000,
            None,
            None,
            {k: round(v, 3) for k, v in cpu.items() if v > 0.0005},
            wrk_cpu / wall,
        )

    async def rest_ttfe(self, session_id: str, turns: int) -> tuple[float, float]:
        """Time to first SSE frame through Envoy, one turn at a time."""
        samples = []
        async with httpx.AsyncClient(base_url=f"http://{self.envoy.listener_address}") as http:
            for _ in range(turns):
                start = time.perf_counter()
                async with http.stream(
                    "POST", f"/v1/sessions/{session_id}/turns", json={"message": MESSAGE}
                ) as response:
                    first = None
                    async for _chunk in response.aiter_raw():
                        if first is None:
                            first = time.perf_counter()
                samples.append(((first or time.perf_counter()) - start) * 1000)
        return percentile(samples, 0.5), percentile(samples, 0.99)

    # Further runs ---------------------------------------------------------------------------

    async def history_costs(self) -> dict[str, float]:
        """p50 turn latency at each history length, turns interleaved across
        the sessions so that drift on a shared machine hits all alike."""
        lengths = (2, 200, 2000)
        sessions = {n: (await self.sessions(1, history=n))[0] for n in lengths}
        samples: dict[int, list[float]] = {n: [] for n in lengths}
        turns = 10 if self.smoke else 300
        async with AsyncClient(self.server.address) as client:
            for i in range(turns + 5):
                for n in lengths if i % 2 else reversed(lengths):
                    start = time.perf_counter()
                    await client.send(sessions[n], MESSAGE, policy="enqueue")
                    if i >= 5:  # the first turns warm the worker's history cache
                        samples[n].append((time.perf_counter() - start) * 1000)
        return {str(n): round(statistics.median(samples[n]), 3) for n in lengths}

    async def long_turn(self) -> dict[str, float]:
        # 5,000 one-letter words (10,000 characters, the message limit), said
        # twice by the echo agent: 10,000 deltas.
        words = 100 if self.smoke else 5_000
        message = " ".join("w" for _ in range(words))
        repeat = 2
        rates: dict[str, float] = {}
        from turnmesh.runtime.serving import insecure_channel
        from turnmesh.v1 import worker_service_pb2 as wpb
        from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub

        for path, address in (("baseline", self.baseline_address), ("worker", self.worker.address)):
            async with insecure_channel(address) as channel:
                start = time.perf_counter()
                count = 0
                request = wpb.RunRequest(session_id="long", turn_id="long", messages=[message])
                request.metadata.update({"repeat": repeat})
                async for reply in WorkerServiceStub(channel).Run(request):
                    count += len(reply.events)
                rates[path] = count / (time.perf_counter() - start)
        (sid,) = await self.sessions(1)
        async with AsyncClient(self.server.address) as client:
            start = time.perf_counter()
            count = 0
            async with client.stream_turn(sid, message, metadata={"repeat": repeat}) as stream:
                async for _ in stream:
                    count += 1
            rates["mesh-grpc"] = count / (time.perf_counter() - start)
        async with httpx.AsyncClient(
            base_url=f"http://{self.envoy.listener_address}", timeout=120
        ) as http:
            start = time.perf_counter()
            count = 0
            async with http.stream(
                "POST",
                f"/v1/sessions/{sid}/turns",
                json={"message": message, "metadata": {"repeat": repeat}},
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        count += 1
            rates["mesh-rest"] = count / (time.perf_counter() - start)
        return {k: round(v, 1) for k, v in rates.items()}

    async def memory_per_session(self, count: int) -> float:
        before = rss_bytes(self.server.pid)
        seed = [
            message_pb2.Message(role="user", content="hello"),
            message_pb2.Message(role="assistant", content="hi there"),
        ]
        async with AsyncClient(self.server.address) as client:
            created = 0

            async def creator() -> None:
                nonlocal created
                while created < count:
                    created += 1
                    await client.create_session(agent="echo", messages=seed)

            await asyncio.gather(*(creator() for _ in range(64)))
        return (rss_bytes(self.server.pid) - before) / count


def up_seconds(workdir: Path) -> float:
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnmesh", "up", "--port", "0", "--run-dir", str(workdir / "up")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    elapsed = float("nan")
    for line in proc.stdout:
        if "turnmesh is up" in line:
            elapsed = time.monotonic() - start
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    return elapsed


WRK_SCRIPT = r"""
local sessions = {}
local body = nil
local counter = 0
function init(args)
  for s in string.gmatch(args[1], "[^,]+") do table.insert(sessions, s) end
  body = '{"message": "' .. args[2] .. '", "policy": "TURN_POLICY_ENQUEUE"}'
  counter = math.random(1, #sessions)
end
function request()
  counter = counter % #sessions + 1
  return wrk.format("POST", "/v1/sessions/" .. sessions[counter] .. "/turns",
    {["Content-Type"] = "application/json"}, body)
end
function done(summary, latency, requests)
  io.write(string.format(
    'TURNMESH {"requests": %d, "duration_us": %d, "errors": %d, "non2xx": %d, '
    .. '"p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(99)))
end
"""


def render_markdown(report: Report) -> str:
    lines = [
        f"Machine: {report.machine}; run {report.started}.",
        "",
        "| path | concurrency | turns/s | ratio to baseline | p50 ms | p99 ms "
        "| first event p50 ms | first event p99 ms | CPU ms per turn "
        "| load generator CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report.cells:
        ttfe = (
            (f"{c.ttfe_p50_ms:.2f}", f"{c.ttfe_p99_ms:.2f}")
            if c.ttfe_p50_ms is not None and c.ttfe_p99_ms is not None
            else ("—", "—")
        )
        cpu = ", ".join(f"{k} {v:.2f}" for k, v in sorted(c.cpu_ms_per_turn.items()))
        lines.append(
            f"| {c.path} | {c.concurrency} | {c.turns_per_s:.0f} | {c.ratio:.2f} "
            f"| {c.p50_ms:.2f} | {c.p99_ms:.2f} | {ttfe[0]} | {ttfe[1]} | {cpu} "
            f"| {c.loadgen_cpu_share:.2f} |"
        )
    h = report.history
    lines += [
        "",
        "| history (messages) | 2 | 200 | 2,000 | 2,000 vs 2 |",
        "|---|---|---|---|---|",
        f"| mesh-grpc turn p50 ms | {h['2']:.2f} | {h['200']:.2f} | {h['2000']:.2f} "
        f"| {h['2000'] / h['2']:.2f} |",
        "",
        "| long turn, events/s | " + " | ".join(report.long_turn_events_per_s) + " |",
        "|---|" + "---|" * len(report.long_turn_events_per_s),
        "| | " + " | ".join(f"{v:.0f}" for v in report.long_turn_events_per_s.values()) + " |",
        "",
        "Memory per idle session (RSS delta / sessions): "
        f"{report.memory_per_idle_session_bytes:.0f} bytes. "
        f"`turnmesh up` ready in {report.up_seconds:.2f} s.",
    ]
    return "\n".join(lines) + "\n"


def render_chart(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = ["baseline", "worker", "mesh-grpc", "mesh-rest"]
    levels = sorted({c.concurrency for c in report.cells})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(paths)
    for i, p in enumerate(paths):
        cells = {c.concurrency: c for c in report.cells if c.path == p}
        xs = [j + i * width for j in range(len(levels))]
        left.bar(xs, [cells[lv].turns_per_s if lv in cells else 0 for lv in levels], width, label=p)
        right.plot(
            levels,
            [cells[lv].p50_ms if lv in cells else float("nan") for lv in levels],
            marker="o",
            label=p,
        )
    left.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], [str(lv) for lv in levels])
    left.set_xlabel("concurrency")
    left.set_ylabel("turns per second")
    left.legend()
    right.set_xscale("log")
    right.set_xlabel("concurrency")
    right.set_ylabel("p50 turn latency (ms)")
    right.legend()
    fig.suptitle("turnmesh: throughput and latency by path (echo turn)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def run(args: argparse.Namespace) -> Report:
    machine = f"{os.cpu_count()} cores, {os.uname().machine}, Python {sys.version.split()[0]}"
    report = Report(machine=machine, started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    with tempfile.TemporaryDirectory(prefix="turnmesh-bench-") as tmp:
        bench = Bench(Path(tmp), args.turns, args.smoke)
        await asyncio.to_thread(bench.start)
        try:
            for concurrency in args.concurrency:
                sessions = await bench.sessions(max(concurrency, 1) * 2)
                turns = max(args.turns, concurrency * 4)
                cells = [
                    await bench.grpc_cell(p, concurrency, turns, sessions)
                    for p in ("baseline", "worker", "mesh-grpc")
                ]
                seconds = 1.0 if args.smoke else 8.0
                cells.append(
                    await asyncio.to_thread(bench.rest_cell, concurrency, sessions, seconds)
                )
                if concurrency == 1:
                    cells[-1].ttfe_p50_ms, cells[-1].ttfe_p99_ms = await bench.rest_ttfe(
                        sessions[0], 10 if args.smoke else 200
                    )
                for cell in cells:
                    cell.ratio = cell.turns_per_s / cells[0].turns_per_s
                report.cells += cells
                for c in cells:
                    print(
                        f"{c.path:10} c={c.concurrency:<3} {c.turns_per_s:7.0f}/s "
                        f"ratio {c.ratio:.2f} p50 {c.p50_ms:.2f} ms",
                        flush=True,
                    )
            report.history = await bench.history_costs()
            report.long_turn_events_per_s = await bench.long_turn()
            report.memory_per_idle_session_bytes = await bench.memory_per_session(args.sessions)
        finally:
            await asyncio.to_thread(bench.stop)
        report.up_seconds = await asyncio.to_thread(up_seconds, Path(tmp))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=100_000, help="for the memory run")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (make test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    (args.out / f"{stamp}.json").write_text(json.dumps(asdict(report), indent=1))
    markdown = render_markdown(report)
    (args.out / f"{stamp}.md").write_text(markdown)
    render_chart(report, args.out / f"{stamp}.png")
    print(markdown)
    print(f"wrote {args.out}/{stamp}.json, .md, .png")


if __name__ == "__main__":
    main()
