"""PostgreSQL stopped and started again under the services: every pooled connection is cut, and the services
must reconnect by themselves, without a process restart."""

from __future__ import annotations

from functools import partial

from tests.faults.harness import blocking, fault_run, under_fault
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick

# A service that dies of the outage spends up to 30 s draining NATS before the supervisor restarts it: the
# short run waits that out before calling a quiet queue stuck, so "slow to come back" is not read as "stuck".
RESTART = (Plan(jobs=30, over_s=12, at_s=4, lasts_s=3, settle_s=60, stall_s=40),
           Plan.long(jobs=300, over_s=60, at_s=20, lasts_s=10, settle_s=240))


async def postgres_restart(long: bool = False) -> Row:
    plan = pick(*RESTART, long)
    async with fault_run("postgres_restart") as run:
        pids = {name: run.supervisor.pid(name) for name in run.supervisor.children}
        await under_fault(run, plan, begin=blocking(partial(run.postgres.stop, "fast")),
                          end=blocking(run.postgres.start))
        run.expect_healthy_outcome()
        run.expect_no_service_restarts()
        changed = {n: (p, run.supervisor.pid(n)) for n, p in pids.items() if run.supervisor.pid(n) != p}
        run.row.expect(not changed, f"service pids changed (before, after): {changed}")
    return run.row
