"""Dependencies that stop answering without dying (tests.faults.stall): every PostgreSQL process stopped, or
the nats-server leading the work stream stopped, while jobs are created and a client keeps reading and
creating. Nothing may fail or get stuck, no service restart, no 500, and every API answer during the stall
comes within the gateway's call bound (VIDJOBS_DB_CALL_TIMEOUT_S) plus a margin: 503 `unavailable` with a
Retry-After, not a wait for the stall to end."""

from __future__ import annotations

from tests.faults.harness import FaultRun, blocking, fault_run, under_fault
from tests.faults.jsapi import jetstream, work_stream_leader
from tests.faults.natsd import NatsNode
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick
from tests.faults.stall import Stall

# The default bound of one database call in the gateway (5 s), and room for a slow machine: an answer
# held for the whole stall (15 s short, 60 s long) is well past it.
ANSWER_LIMIT_S = 12.0

POSTGRES = (Plan(jobs=30, over_s=20, at_s=3, lasts_s=15, settle_s=60, stall_s=40),
            Plan.long(jobs=200, over_s=100, at_s=15, lasts_s=60, settle_s=300))
JETSTREAM = (Plan(jobs=30, over_s=16, at_s=3, lasts_s=10, settle_s=60, stall_s=40),
             Plan.long(jobs=200, over_s=60, at_s=12, lasts_s=30, settle_s=300))


async def postgres_stall(long: bool = False) -> Row:
    """Every PostgreSQL process SIGSTOPped (15 s short, 60 s long): connections stay open and nothing answers."""
    plan = pick(*POSTGRES, long)
    async with fault_run("postgres_stall") as run:
        with Stall(lambda: run.postgres.pid).guarded() as stall:
            await under_fault(run, plan, begin=blocking(stall.begin), end=blocking(stall.end), probe=True)
        run.expect_healthy_outcome()
        run.expect_no_service_restarts()
        run.expect_answers_within(ANSWER_LIMIT_S)
    return run.row


async def _work_leader(run: FaultRun) -> NatsNode:
    assert run.cluster is not None
    async with jetstream(run.cluster.urls) as (_, js):
        leader = await work_stream_leader(js)
    if not leader:
        raise RuntimeError("the work stream has no leader")
    return run.cluster.node(leader)


async def jetstream_stall(long: bool = False) -> Row:
    """Three nodes, streams R3, the services given every node's URL: the nats-server leading the work stream
    SIGSTOPped (10 s short, 30 s long). Its clients' connections stay open and nothing answers on them; the
    others elect a new leader."""
    plan = pick(*JETSTREAM, long)
    async with fault_run("jetstream_stall", cluster=True, every_url=True, stream_replicas=3) as run:
        leader = await _work_leader(run)
        run.say(f"work stream leader: {leader.name}")
        with Stall(lambda: leader.pid).guarded() as stall:
            await under_fault(run, plan, begin=blocking(stall.begin), end=blocking(stall.end), probe=True)
        run.expect_healthy_outcome()
        run.expect_no_service_restarts()
        run.expect_answers_within(ANSWER_LIMIT_S)
    return run.row
