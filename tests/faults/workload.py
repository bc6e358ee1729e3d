"""Jobs created through the HTTP API at a steady pace, retried through a gateway that is briefly down or
refusing (an Idempotency-Key makes a retry return the same job, never a second one)."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.stack import Stack

CREATE_WITHIN_S = 60.0  # a create still failing after this long is counted as refused, not retried further


@dataclass
class Workload:
    jobs: int
    over_s: float  # creates are spread evenly over this long
    render_s: float = 1.0
    extra_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Created:
    ids: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # last answer of each create that never succeeded
    retries: int = 0


def job_body(workload: Workload, i: int) -> dict[str, Any]:
    # A handful of distinct clips, so the fake provider encodes each once and its CPU stays out of the way.
    return {"model": "fake/default", "prompt": f"fault suite clip {i}", "duration_s": 1, "seed": i % 4,
            "params": {"render_s": workload.render_s, **workload.extra_params}}


async def create_one(stack: Stack, body: dict[str, Any], key: str, created: Created) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CREATE_WITHIN_S
    headers = {**stack.auth, "Idempotency-Key": key}
    while True:
        try:
            async with stack.session.post(f"{stack.url}/v1/jobs", json=body, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=10)) as resp:
                data = await resp.json(content_type=None)
                if resp.status in (200, 201):
                    created.ids.append(data["id"])
                    return
                last = f"{resp.status}: {data}"
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            last = repr(exc)
        if loop.time() > deadline:
            created.refused.append(last)
            return
        created.retries += 1
        await asyncio.sleep(0.5)


async def create_jobs(stack: Stack, workload: Workload) -> Created:
    """Start one create every over_s/jobs seconds; return once every create has succeeded or given up."""
    created = Created()
    run = secrets.token_hex(3)
    gap = workload.over_s / max(workload.jobs, 1)
    tasks = []
    for i in range(workload.jobs):
        tasks.append(asyncio.create_task(create_one(stack, job_body(workload, i), f"faults-{run}-{i}", created)))
        await asyncio.sleep(gap)
    await asyncio.gather(*tasks)
    return created
