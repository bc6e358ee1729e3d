"""What a client sees of the API while a fault lasts: a read (GET /v1/jobs/{id}) and a create (POST /v1/jobs)
sent one after another, without pause, each timed from send to answer.

The probes wait far longer than any fault lasts, so an answer held up by a stalled dependency is measured
whole, not cut off at a client's timeout. A create that got no 2xx is sent again with the same
Idempotency-Key once the fault is over, so every job a probe may have created is known and settled."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.faults.workload import Created, Workload, create_one, job_body
from tests.stack import Stack

PATIENCE_S = 300.0  # longer than any fault: the answer's whole time is the measurement


@dataclass
class Answers:
    slowest_s: float = 0.0
    slowest: str = ""  # which request it was
    count: int = 0
    statuses: Counter[int] = field(default_factory=Counter)  # 0: no HTTP answer at all (connection failed)
    unanswered_creates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (key, body)

    def note(self, what: str, status: int, took_s: float) -> None:
        self.count += 1
        self.statuses[status] += 1
        if took_s > self.slowest_s:
            self.slowest_s, self.slowest = took_s, f"{what} -> {status or 'no answer'}"

    @property
    def server_errors(self) -> dict[int, int]:
        return {s: n for s, n in sorted(self.statuses.items()) if s >= 500}


async def _timed(stack: Stack, method: str, path: str, *, headers: dict[str, str] | None = None,
                 **kwargs: Any) -> tuple[int, float, Any]:
    """The answer's status (0 for none), its time and its JSON body (None when it has none)."""
    started = time.monotonic()
    status, data = 0, None
    try:
        async with stack.session.request(method, f"{stack.url}{path}", headers={**stack.auth, **(headers or {})},
                                         timeout=aiohttp.ClientTimeout(total=PATIENCE_S), **kwargs) as resp:
            status = resp.status
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return status, time.monotonic() - started, data


async def _reads(stack: Stack, job_id: str, answers: Answers, until: asyncio.Event) -> None:
    while not until.is_set():
        status, took, _ = await _timed(stack, "GET", f"/v1/jobs/{job_id}")
        answers.note("GET /v1/jobs/{id}", status, took)
        await asyncio.sleep(0.05)


async def _creates(stack: Stack, answers: Answers, created: Created, until: asyncio.Event) -> None:
    run, i = secrets.token_hex(3), 0
    workload = Workload(jobs=0, over_s=0)
    while not until.is_set():
        key, body = f"probe-{run}-{i}", job_body(workload, 1000 + i)
        i += 1
        status, took, data = await _timed(stack, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        answers.note("POST /v1/jobs", status, took)
        if status in (200, 201) and isinstance(data, dict):
            created.ids.append(data["id"])
        else:
            answers.unanswered_creates.append((key, body))
        await asyncio.sleep(0.05)


class Probe:
    """Reads and creates sent while the fault lasts: `start` once the stack is up (it creates the job it
    reads), `begin` as the fault begins, `end` as it ends; `finish` settles the creates that got no answer
    and adds every job the probe created to `created`."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.answers = Answers()
        self.created = Created()
        self._until = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._job_id = ""

    async def start(self) -> None:
        self._job_id = (await self.stack.create_job(params={"render_s": 1.0}))["id"]
        self.created.ids.append(self._job_id)

    def begin(self) -> None:
        self._tasks = [asyncio.create_task(_reads(self.stack, self._job_id, self.answers, self._until)),
                       asyncio.create_task(_creates(self.stack, self.answers, self.created, self._until))]

    async def end(self) -> None:
        """Stop sending; the requests still out are waited for (their time is what is measured)."""
        self._until.set()
        await asyncio.gather(*self._tasks)

    async def finish(self, created: Created) -> None:
        """Send the unanswered creates again (same key: the same job, or a new one if none was made)."""
        for key, body in self.answers.unanswered_creates:
            await create_one(self.stack, body, key, self.created)
        created.ids.extend(i for i in dict.fromkeys(self.created.ids) if i not in created.ids)
        created.refused.extend(self.created.refused)
