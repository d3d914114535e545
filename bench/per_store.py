"""What the benchmarks run once per store share (bench/listing.py,
bench/webhooks.py, bench/a2a_push.py): the command line, a work folder per
store, a JSON row each, and the machine's speed printed beside them."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# One store's run: (store, the count asked for, its work folder) -> its row.
Measure = Callable[[str, int, Path], Awaitable[dict[str, Any]]]


def machine_speed() -> float:
    """Pure-Python loop iterations per microsecond: a rough speed of this
    machine, printed beside the figures."""
    started = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    return round(2.0 / (time.perf_counter() - started), 1)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def rows(name: str, stores: list[str], count: int, measure: Measure) -> list[dict[str, Any]]:
    """``measure`` for each store in turn, each in a folder of its own; each
    row printed as JSON as it comes."""
    found = []
    for store in stores:
        with tempfile.TemporaryDirectory(prefix=f"turnmesh-{name}-{store}-") as tmp:
            row = await measure(store, count, Path(tmp))
        print(json.dumps(row), flush=True)
        found.append(row)
    return found


def main(doc: str, name: str, count: tuple[str, int], measure: Measure) -> None:
    """The command line: ``--<count> N`` and ``--stores …``, then a row per store."""
    flag, default = count
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--stores", nargs="+", default=["memory", "sqlite", "redis"])
    args = parser.parse_args()
    speed = machine_speed()
    print(f"machine: {os.cpu_count()} cores, {speed} M loop iterations/s", flush=True)
    asyncio.run(rows(name, args.stores, getattr(args, flag), measure))
