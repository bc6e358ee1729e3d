"""API calls made over and over while a dependency stalls, each one timed: how long a client waits for an
answer while a server we depend on accepts connections but does not answer, and which answers it gets.

Each probe starts on its own (a slow answer does not hold back the next), so the longest answer is a real
client's wait, not a queue behind it. A probe's own time limit is far longer than any stall, so a request that
hangs is measured as long as it hangs."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from tests.faults.report import Row
from tests.stack import Stack

CLIENT_WAIT_S = 300.0  # longer than every stall: a hanging request is timed, not cut short by us
READY_WAIT_S = 5.0  # a readiness probe's own time limit, as a kubelet's would be


@dataclass
class Answer:
    route: str
    seconds: float
    status: int  # 0: no HTTP answer at all (the connection failed)


@dataclass
class Probes:
    answers: list[Answer] = field(default_factory=list)
    ready: Counter[str] = field(default_factory=Counter)  # a worker's /readyz answers: "ready" / "not ready"

    def longest(self) -> Answer | None:
        return max(self.answers, key=lambda a: a.seconds, default=None)

    def statuses(self) -> Counter[int]:
        return Counter(a.status for a in self.answers)

    def report(self, row: Row, *, within_s: float) -> None:
        """Notes on the row, and what must hold: no 500 (nor any 5xx but 503), each answer within `within_s`."""
        longest = self.longest()
        if longest is None:
            row.expect(False, "no API probe ran during the stall")
            return
        by_route = Counter(a.route for a in self.answers)
        row.notes.append(f"API during the stall: {len(self.answers)} probes {dict(by_route)}, longest answer "
                         f"{longest.seconds:.1f} s ({longest.route} -> {longest.status}), answers by status "
                         f"{dict(sorted(self.statuses().items()))}")
        if self.ready:
            row.notes.append(f"media /readyz during the stall: {dict(self.ready)}")
        server_errors = {s: n for s, n in self.statuses().items() if s >= 500 and s != 503}
        row.expect(not server_errors, f"5xx other than 503 during the stall: {server_errors}")
        row.expect(longest.seconds <= within_s,
                   f"an API answer took {longest.seconds:.1f} s during the stall ({longest.route}), "
                   f"over {within_s:.0f} s")


Call = Callable[[aiohttp.ClientSession], Awaitable[int]]


async def timed(route: str, call: Call, session: aiohttp.ClientSession, probes: Probes) -> None:
    started = time.monotonic()
    try:
        status = await call(session)
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    probes.answers.append(Answer(route, time.monotonic() - started, status))


def get_job(stack: Stack, job_id: str) -> Call:
    async def call(session: aiohttp.ClientSession) -> int:
        async with session.get(f"{stack.url}/v1/jobs/{job_id}", headers=stack.auth) as resp:
            await resp.read()
            return resp.status
    return call


def upload(stack: Stack, image: bytes) -> Call:
    async def call(session: aiohttp.ClientSession) -> int:
        async with session.post(f"{stack.url}/v1/uploads", data=image,
                                headers={**stack.auth, "Content-Type": "image/png"}) as resp:
            await resp.read()
            return resp.status
    return call


async def probing(calls: dict[str, Call], stop: asyncio.Event, probes: Probes, *, every_s: float = 1.0,
                  ready_port: int | None = None) -> None:
    """Start every call each `every_s` until `stop` is set, then wait for the answers still coming. With
    `ready_port`, a worker's /readyz is asked as often (its answers counted apart from the API's)."""
    timeout = aiohttp.ClientTimeout(total=CLIENT_WAIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        running: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            for route, call in calls.items():
                running.add(asyncio.create_task(timed(route, call, session, probes)))
            if ready_port is not None:
                running.add(asyncio.create_task(_ready(session, ready_port, probes)))
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass
        if running:
            await asyncio.wait(running)


async def _ready(session: aiohttp.ClientSession, port: int, probes: Probes) -> None:
    """As a kubelet asks: an answer that does not come within READY_WAIT_S counts as not ready."""
    try:
        async with session.get(f"http://127.0.0.1:{port}/readyz",
                               timeout=aiohttp.ClientTimeout(total=READY_WAIT_S)) as resp:
            await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    probes.ready["ready" if status == 200 else "not ready"] += 1
