"""A tiny run of the benchmark suite, so it cannot rot (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def _run(module: str, *args: str) -> str:
    """A benchmark module's run to its end; its standard output."""
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _bench(module: str, *args: str) -> dict[str, Any]:
    """A benchmark that prints one JSON report."""
    report: dict[str, Any] = json.loads(_run(module, *args))
    return report


def test_bench_suite_smoke_run(tmp_path: Path) -> None:
    _run(
        "bench.suite", "--smoke", "--concurrency", "1", "2", "--turns", "20",
        "--sessions", "200", "--out", str(tmp_path),
    )  # fmt: skip
    (report_file,) = tmp_path.glob("*.json")
    report = json.loads(report_file.read_text())
    paths = {(c["path"], c["concurrency"]) for c in report["cells"]}
    assert paths == {
        (p, c) for p in ("baseline", "worker", "mesh-grpc", "mesh-rest") for c in (1, 2)
    }
    assert all(c["turns_per_s"] > 0 for c in report["cells"])
    assert set(report["history"]) == {"2", "200", "2000"}
    assert set(report["long_turn_events_per_s"]) == {"baseline", "worker", "mesh-grpc", "mesh-rest"}
    assert report["up_seconds"] > 0
    assert list(tmp_path.glob("*.png"))
    assert "| path | concurrency |" in next(tmp_path.glob("*.md")).read_text()


def test_listing_bench_smoke_run() -> None:
    output = _run("bench.listing", "--sessions", "30", "--stores", "memory")
    row = json.loads(output.strip().splitlines()[-1])
    assert row["store"] == "memory" and row["sessions_of_the_principal"] == 30
    assert row["page_of_100_p50_ms"] > 0 and row["get_session_p50_ms"] > 0


def test_paced_bench_smoke_run(tmp_path: Path) -> None:
    """Paced streams on both paths: every turn finishes, every level is
    reported with CPU per process and the machine's speed."""
    _run("bench.paced", "--smoke", "--out", str(tmp_path))
    (report_file,) = tmp_path.glob("paced-*.json")
    report = json.loads(report_file.read_text())
    assert report["baseline_turns_per_s"] > 0 and report["baseline_cpu_ms_per_message"] > 0
    assert [(row["kind"], row["streams"]) for row in report["levels"]] == [
        ("rest", 4),
        ("grpc", 4),
    ]
    for row in report["levels"]:
        assert row["failed"] == {} and row["turns"] == 4 and row["events_per_s"] > 0
        assert {"server", "worker", "client"} <= set(row["cpu_ms_per_event"])
    assert "envoy" in report["levels"][0]["cpu_ms_per_event"]
    assert "| rest | 4 |" in next(tmp_path.glob("paced-*.md")).read_text()


def test_compat_cost_bench_smoke_run() -> None:
    report = _bench(
        "bench.compat_cost", "--turns", "16", "--concurrency", "4", "--rounds", "2"
    )  # fmt: skip
    surfaces = {
        *("native-rest", "native-rest-new", "chat-completions", "responses", "agui"),
        *("a2a", "a2a-jsonrpc"),
    }
    assert set(report["cpu_ms_per_turn"]) == surfaces
    assert report["failed"] == dict.fromkeys(surfaces, 0)
    assert all(cpu["server"] > 0 for cpu in report["cpu_ms_per_turn"].values())
    assert report["server_cpu_ratio_to_native_rest"]["native-rest"] == 1.0


def test_webhooks_bench_smoke_run() -> None:
    output = _run("bench.webhooks", "--turns", "10", "--stores", "memory")
    row = json.loads(output.strip().splitlines()[-1])
    assert (row["store"], row["turns"]) == ("memory", 10)
    assert row["ratio_to_turn"] > 0 and row["notice_after_end_p50_ms"] >= 0


def test_a2a_push_bench_smoke_run() -> None:
    output = _run("bench.a2a_push", "--turns", "5", "--stores", "memory")
    row = json.loads(output.strip().splitlines()[-1])
    assert (row["store"], row["turns"]) == ("memory", 5)
    assert row["ratio_to_task"] > 0 and row["push_after_answer_p99_ms"] > -1000


def test_retention_bench_smoke_run() -> None:
    report = _bench(
        "bench.retention", "--turns", "200", "--sessions", "20", "--window", "1"
    )  # fmt: skip
    assert report["turns"] == 200 and report["baseline_turns_per_s"] > 0
    # At the end some logs may have expired already (a 1 s window on a busy
    # machine); test_resume_cancel checks the gauge within its budget.
    assert report["event_log_bytes_at_end"] >= 0
    assert report["event_log_bytes_after_window"] == 0  # every finished turn's events went
    assert "server_bytes_per_turn_after_window" in report


def test_floors_bench_smoke_run() -> None:
    """Every sender delivers every word (the bench exits non-zero if one is
    lost) and each is reported."""
    output = _run("bench.floors", "--smoke")
    rows = [line for line in output.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == [
        "grpc", "stream_layers", "tasks", "pump",
    ]  # fmt: skip
    assert "20 streams x 5 words" in output
