"""Paced streams (part of `make bench`): the traffic agents make. N
conversations at once, each a loop of turns whose echo agent says one word
every 40 ms (25 tokens a second, 40 words a turn), for N rising until turns
fail or the added gap passes a second; through Envoy (REST/SSE) and over
native gRPC to a session server.

Reported per N: events relayed a second, the gap between words beyond the
agent's own 40 ms (p50, p99), failed turns, CPU per relayed event of each
process (server, worker, Envoy, client), and the client's share of a core (it
must not be what limits the run). Next to them, the machine's speed: the bare
grpc.aio baseline's turns/s at concurrency 16 and its CPU per streamed
message, measured in the same run (bench/suite.py has the baseline).

Writes bench/results/paced-<stamp>.json and .md. Loopback only, bounded.

Usage: python -m bench.paced [--levels 50 100 250 500] [--turns 2] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.suite import RESULTS, Bench, cpu_seconds, percentile

# The baseline turn (bench/baseline.py) streams 9 messages: RUN_STARTED, a
# text message of five words, RUN_FINISHED.
BASELINE_EVENTS_PER_TURN = 9
# A level whose p99 added gap passes this is where the rise stops.
GIVE_UP_GAP_MS = 1000.0


@dataclass
class Level:
    kind: str
    streams: int
    turns: int
    events_per_s: float
    added_gap_p50_ms: float
    added_gap_p99_ms: float
    first_word_p50_ms: float
    first_word_p99_ms: float
    turn_p99_ms: float
    failed: dict[str, int]
    cpu_ms_per_event: dict[str, float]
    client_cpu_share: float
    cpu_ms_per_event_mesh: float = 0.0


@dataclass
class PacedReport:
    machine: str
    started: str
    baseline_turns_per_s: float = 0.0
    baseline_cpu_ms_per_message: float = 0.0
    words: int = 40
    delay_ms: int = 40
    levels: list[Level] = field(default_factory=list)


async def run_client(
    kind: str, target: str, ids: Path, turns: int, words: int, delay_ms: int, graph: str = "paced"
) -> dict[str, Any]:
    """One run of bench/paced_client.py (a process of its own, so its CPU is
    its own): every session in the file ``ids`` takes ``turns`` turns."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.paced_client",
        *("--target", target, "--kind", kind, "--sessions", str(ids), "--graph", graph),
        *("--turns", str(turns), "--words", str(words), "--delay-ms", str(delay_ms)),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the paced client failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


async def level(bench: Bench, kind: str, streams: int, args: argparse.Namespace) -> Level:
    sessions = await bench.sessions(streams)
    ids = bench.workdir / f"sessions-{kind}-{streams}.txt"
    ids.write_text("\n".join(sessions))
    target = bench.envoy.listener_address if kind == "rest" else bench.server.address
    pids = {
        "server": bench.server.pid,
        "worker": bench.worker.pid,
        "envoy": bench.envoy.proc.pid,
    }
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    result = await run_client(kind, target, ids, args.turns, args.words, args.delay_ms)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    events = max(1, result["events"])
    cpu = {name: (after[name] - before[name]) * 1000 / events for name in pids}
    if kind == "grpc":
        del cpu["envoy"]  # not on the path
    cpu["client"] = result["cpu_s"] * 1000 / events
    gaps = result["added_gap_ms"]
    return Level(
        kind=kind,
        streams=streams,
        turns=result["turns"],
        events_per_s=round(result["events"] / result["wall_s"], 1),
        added_gap_p50_ms=round(percentile(gaps, 0.5), 1),
        added_gap_p99_ms=round(percentile(gaps, 0.99), 1),
        first_word_p50_ms=round(percentile(result["first_word_ms"], 0.5), 1),
        first_word_p99_ms=round(percentile(result["first_word_ms"], 0.99), 1),
        turn_p99_ms=round(percentile(result["turn_ms"], 0.99), 1),
        failed=result["failed"],
        cpu_ms_per_event={k: round(v, 4) for k, v in cpu.items()},
        client_cpu_share=round(result["cpu_s"] / result["wall_s"], 3),
        cpu_ms_per_event_mesh=round(sum(v for k, v in cpu.items() if k != "client"), 4),
    )


async def run(args: argparse.Namespace, workdir: Path) -> PacedReport:
    report = PacedReport(
        machine=f"{os.cpu_count()} CPUs, {os.uname().machine}",
        started=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        words=args.words,
        delay_ms=args.delay_ms,
    )
    server_args = ("--max-turns", str(args.max_turns)) if args.max_turns else ()
    bench = Bench(workdir, turns=0, smoke=args.smoke, server_args=server_args)
    bench.start()
    try:
        speed = await bench.grpc_cell("baseline", 16, 200 if args.smoke else 4000, [])
        report.baseline_turns_per_s = round(speed.turns_per_s, 1)
        report.baseline_cpu_ms_per_message = round(
            speed.cpu_ms_per_turn.get("baseline", 0.0) / BASELINE_EVENTS_PER_TURN, 4
        )
        for kind in args.kinds:
            for streams in args.levels:
                row = await level(bench, kind, streams, args)
                report.levels.append(row)
                print(json.dumps(asdict(row)), flush=True)
                if sum(row.failed.values()) or row.added_gap_p99_ms > GIVE_UP_GAP_MS:
                    break
    finally:
        bench.stop()
    return report


def render_markdown(report: PacedReport) -> str:
    base = report.baseline_cpu_ms_per_message or float("nan")
    lines = [
        f"Machine: {report.machine}; run {report.started}. Machine speed: the bare grpc.aio"
        f" baseline streams {report.baseline_turns_per_s:g} turns/s at concurrency 16, at"
        f" {report.baseline_cpu_ms_per_message:g} ms of CPU per streamed message.",
        "",
        f"Each stream: turns of {report.words} words, one every {report.delay_ms} ms.",
        "",
        "| path | streams | events/s | added gap p50 / p99 ms | first word p50 / p99 ms "
        "| turn p99 ms | failed turns | mesh CPU ms per event (x baseline message) "
        "| per process | client CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report.levels:
        failed = ", ".join(f"{k} {v}" for k, v in row.failed.items()) or "0"
        per = ", ".join(f"{k} {v:.3f}" for k, v in row.cpu_ms_per_event.items() if k != "client")
        lines.append(
            f"| {row.kind} | {row.streams} | {row.events_per_s:g} "
            f"| {row.added_gap_p50_ms:g} / {row.added_gap_p99_ms:g} "
            f"| {row.first_word_p50_ms:g} / {row.first_word_p99_ms:g} | {row.turn_p99_ms:g} "
            f"| {failed} "
            f"| {row.cpu_ms_per_event_mesh:.3f} ({row.cpu_ms_per_event_mesh / base:.1f}x) "
            f"| {per} | {row.client_cpu_share:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[50, 100, 250, 500])
    parser.add_argument("--kinds", nargs="+", choices=["rest", "grpc"], default=["rest", "grpc"])
    parser.add_argument("--turns", type=int, default=2, help="turns per conversation")
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--delay-ms", type=int, default=40)
    parser.add_argument(
        "--max-turns", type=int, default=0, help="the server's --max-turns (0: its default)"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run (make test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.smoke:
        args.levels, args.turns, args.words, args.delay_ms = [4], 1, 5, 10
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run(args, Path(tmp)))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"paced-{report.started.replace(':', '')}"
    stem.with_suffix(".json").write_text(json.dumps(asdict(report), indent=2))
    markdown = render_markdown(report)
    stem.with_suffix(".md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
