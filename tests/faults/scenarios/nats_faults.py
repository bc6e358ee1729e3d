"""NATS faults: JetStream answering "no responders", the server SIGKILLed under a create storm, and the work
stream's leader killed in a three-node cluster."""

from __future__ import annotations

import asyncio
from functools import partial

from tests.faults.harness import FaultRun, blocking, fault_run, under_fault
from tests.faults.jsapi import jetstream, step_down_work_leader, work_stream_leader
from tests.faults.natsd import NatsNode
from tests.faults.report import Row
from tests.faults.scenarios.plans import Plan, pick

UNAVAILABLE = (Plan(jobs=30, over_s=12, at_s=2, lasts_s=10, settle_s=45),
               Plan.long(jobs=300, over_s=60, at_s=20, lasts_s=10, settle_s=240))
KILL = (Plan(jobs=50, over_s=6, at_s=2, lasts_s=2, settle_s=45),
        Plan.long(jobs=300, over_s=20, at_s=8, lasts_s=2, settle_s=240))
LEADER = (Plan(jobs=60, over_s=10, at_s=2, lasts_s=8, settle_s=45),
          Plan.long(jobs=300, over_s=40, at_s=12, lasts_s=8, settle_s=300))


async def jetstream_unavailable(long: bool = False) -> Row:
    """JetStream switched off by config reload for 10 s: connections stay up, every JetStream request
    (publish acks, fetches, acks) meets "no responders" until it is switched back on."""
    plan = pick(*UNAVAILABLE, long)
    async with fault_run("jetstream_unavailable") as run:
        node = run.nats
        assert node is not None
        await under_fault(run, plan, begin=blocking(partial(node.set_jetstream, False)),
                          end=blocking(partial(node.set_jetstream, True)))
        run.expect_healthy_outcome()
    return run.row


async def nats_kill(long: bool = False) -> Row:
    """nats-server SIGKILLed in the middle of a create storm, back on the same port and store 2 s later."""
    plan = pick(*KILL, long)
    async with fault_run("nats_kill") as run:
        node = run.nats
        assert node is not None
        await under_fault(run, plan, begin=blocking(node.kill), end=blocking(node.start))
        run.expect_healthy_outcome()
    return run.row


async def _leader_off_the_seed(run: FaultRun) -> NatsNode:
    """The node leading VIDJOBS_WORK, moved off the services' seed node first (bus.connect takes one URL, so
    killing the seed would test that limitation rather than a leader election)."""
    assert run.cluster is not None
    seed = run.cluster.nodes[0].name
    async with jetstream(run.cluster.urls) as (nc, js):
        for _ in range(10):
            leader = await work_stream_leader(js)
            if leader and leader != seed:
                return run.cluster.node(leader)
            await step_down_work_leader(nc)
            await asyncio.sleep(1)
    raise RuntimeError(f"the work stream's leader stayed on the seed node {seed}")


async def cluster_leader(long: bool = False) -> Row:
    """Three nodes, streams R3: the work stream's leader SIGKILLed mid-run and restarted 8 s later."""
    plan = pick(*LEADER, long)
    async with fault_run("cluster_leader", cluster=True, stream_replicas=3) as run:
        leader = await _leader_off_the_seed(run)
        run.say(f"work stream leader: {leader.name}")
        await under_fault(run, plan, begin=blocking(leader.kill), end=blocking(leader.start))
        run.expect_healthy_outcome()
    return run.row
