"""Unclear submit outcomes: the provider accepts a render, but its answer is lost (it comes after our timeout,
or the connection drops first) on a fifth of the submits. Every attempt must still be rendered once, with the
render looked up where the provider allows it, and by the same idempotency key where it does not."""

from __future__ import annotations

import asyncio

from tests.faults.harness import fault_run
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick
from tests.faults.workload import Created, Workload, create_jobs

UNCLEAR = (Plan(jobs=40, over_s=8, at_s=0, lasts_s=0, settle_s=60, render_s=0.5),
           Plan.long(jobs=300, over_s=60, at_s=0, lasts_s=0, settle_s=240, render_s=1))
LOST_ANSWERS = ({"scenario": "accept_then_timeout", "answer_after_s": 3}, {"scenario": "accept_then_drop"})


async def unclear_submits_lookup(long: bool = False) -> Row:
    return await _unclear("unclear_submits_lookup", pick(*UNCLEAR, long), lookup=True)


async def unclear_submits_key_only(long: bool = False) -> Row:
    return await _unclear("unclear_submits_key_only", pick(*UNCLEAR, long), lookup=False)


async def _unclear(name: str, plan: Plan, *, lookup: bool) -> Row:
    async with fault_run(name, provider_timeout_s=1.0) as run:
        unclear_each = plan.jobs // 10  # a tenth per way of losing the answer: a fifth of the submits
        workloads = [Workload(unclear_each, plan.over_s, plan.render_s, {**lost, "lookup": lookup})
                     for lost in LOST_ANSWERS]
        workloads.append(Workload(plan.jobs - 2 * unclear_each, plan.over_s, plan.render_s))
        parts = await asyncio.gather(*(create_jobs(run.stack, w) for w in workloads))
        created = Created(ids=[i for p in parts for i in p.ids], refused=[r for p in parts for r in p.refused])
        run.fault_end = None
        await run.settle(created, plan.settle_s, plan.stall_s)
        run.expect_healthy_outcome()
        counters = await run.stack.counters()
        lost = sum(counters.get("lost_answers_by_job", {}).values())
        run.row.notes.append(f"submit answers lost on purpose: {lost} of {len(created.ids)} jobs")
        run.row.expect(lost >= 2 * unclear_each, f"only {lost} answers were lost: the fault did not happen")
    return run.row
