"""A webhook receiver on loopback for tests: a real HTTP server (aiohttp)
that answers from a script of statuses and keeps every request."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


@dataclass
class Receiver:
    """Answers each request with the next status of ``script`` (then 200)."""

    url: str = ""
    script: list[int] = field(default_factory=list)
    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    # When each request arrived (Unix seconds), beside ``seen``.
    times: list[float] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    # Set: each request waits for it before it is answered.
    hold: asyncio.Event | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((dict(request.headers), await request.read()))
        self.times.append(time.time())
        self.arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        return web.Response(status=self.script.pop(0) if self.script else 200)

    async def requests(self, count: int) -> None:
        while True:
            self.arrived.clear()  # before the check: a request in between sets it again
            if len(self.seen) >= count:
                return
            await asyncio.wait_for(self.arrived.wait(), 120)


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[Receiver]:
    """A receiver on this test's own loop (an async fixture may run on another)."""
    got = Receiver()
    app = web.Application()
    app.router.add_post("/hook", got.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    got.url = f"http://127.0.0.1:{port}/hook"
    yield got
    await runner.cleanup()
