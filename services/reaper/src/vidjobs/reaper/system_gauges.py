"""Gauges of the whole system read from PostgreSQL and JetStream: unfinished jobs by status and stage, the
age of the oldest job in each stage (a stuck job), the outbox backlog, and each work consumer's pending
messages.

The reaper exports them because it already watches every live job's clock. They are read on a timer, not per
scrape, each through an index (jobs_unfinished holds only unfinished jobs, the outbox only unrelayed rows), so
a million finished jobs cost nothing. Every reaper replica exports the same values: query them with max()
across replicas, never sum() (docs/RUNBOOK.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vidjobs.common import bus
from vidjobs.common.runtime import Runtime, every
from vidjobs.common.states import NON_TERMINAL, STAGE_OF, JobStatus, sql

log = logging.getLogger("vidjobs.reaper")

REFRESH_S = 10.0

# The same statuses as jobs_unfinished's predicate (migration 0012), as constants, so that the planner uses that
# index (a test checks the plan).
UNFINISHED_SQL = f"""
    SELECT status::text AS status, count(*) AS jobs,
           extract(epoch FROM clock_timestamp() - min(stage_at))::float8 AS oldest_s
    FROM jobs
    WHERE status IN {sql(NON_TERMINAL)} AND deleted_at IS NULL
    GROUP BY status
"""
OUTBOX_SQL = """
    SELECT count(*) AS rows, COALESCE(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8 AS oldest_s
    FROM outbox
"""
UNFINISHED_STAGES = sorted({STAGE_OF[s].value for s in NON_TERMINAL})


@dataclass
class Snapshot:
    taken: float  # time.monotonic() when read: ages grow from here between reads
    jobs: dict[str, int] = field(default_factory=dict)  # status -> unfinished jobs
    oldest_s: dict[str, float] = field(default_factory=dict)  # stage -> age of its oldest job's stage clock
    outbox_rows: int = 0
    outbox_oldest_s: float = 0.0
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)  # durable -> (num_pending, num_ack_pending)


class SystemGauges(Collector):
    """Serves the last snapshot; ages are brought up to the moment of the scrape, so a stuck job's age keeps
    growing even while the database cannot be read."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None

    def collect(self) -> Iterator[Metric]:
        shot = self.snapshot
        if shot is None:
            return
        since = time.monotonic() - shot.taken
        yield _jobs_family(shot)
        oldest = GaugeMetricFamily("vidjobs_job_oldest_stage_age_seconds",
                                   "Time the oldest unfinished job has spent in its stage (0: none there)",
                                   labels=["stage"])
        for stage in UNFINISHED_STAGES:
            age = shot.oldest_s.get(stage)
            oldest.add_metric([stage], 0.0 if age is None else age + since)
        yield oldest
        yield GaugeMetricFamily("vidjobs_outbox_backlog", "Outbox rows not yet published to JetStream",
                                value=shot.outbox_rows)
        yield GaugeMetricFamily("vidjobs_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox row",
                                value=shot.outbox_oldest_s + since if shot.outbox_rows else 0.0)
        yield from _consumer_families(shot)


def _jobs_family(shot: Snapshot) -> GaugeMetricFamily:
    family = GaugeMetricFamily("vidjobs_jobs_unfinished", "Unfinished jobs (not deleted), by status and stage",
                               labels=["status", "stage"])
    for status in sorted(NON_TERMINAL):
        family.add_metric([status.value, STAGE_OF[status].value], shot.jobs.get(status.value, 0))
    return family


def _consumer_families(shot: Snapshot) -> Iterator[GaugeMetricFamily]:
    pending = GaugeMetricFamily("vidjobs_consumer_pending_messages",
                                "Work messages not yet delivered to a durable consumer (JetStream num_pending)",
                                labels=["consumer"])
    acks = GaugeMetricFamily("vidjobs_consumer_ack_pending_messages",
                             "Messages delivered to a durable consumer and not yet acknowledged, deferred ones "
                             "included (JetStream num_ack_pending)", labels=["consumer"])
    for durable, (waiting, unacked) in sorted(shot.pending.items()):
        pending.add_metric([durable], waiting)
        acks.add_metric([durable], unacked)
    yield pending
    yield acks


async def read(rt: Runtime) -> Snapshot:
    shot = Snapshot(taken=time.monotonic())
    for row in await rt.pool.fetch(UNFINISHED_SQL):
        shot.jobs[row["status"]] = row["jobs"]
        stage = STAGE_OF[JobStatus(row["status"])].value
        shot.oldest_s[stage] = max(shot.oldest_s.get(stage, 0.0), row["oldest_s"] or 0.0)
    outbox = await rt.pool.fetchrow(OUTBOX_SQL)
    assert outbox is not None  # an aggregate without GROUP BY returns one row, whatever the table holds
    shot.outbox_rows, shot.outbox_oldest_s = outbox["rows"], outbox["oldest_s"]
    for info in await rt.js.consumers_info(bus.WORK_STREAM):
        shot.pending[info.name] = (info.num_pending or 0, info.num_ack_pending or 0)
    return shot


async def refresh(rt: Runtime, gauges: SystemGauges) -> None:
    gauges.snapshot = await read(rt)


async def run(rt: Runtime, gauges: SystemGauges | None = None) -> None:
    if gauges is None:
        gauges = SystemGauges()
        REGISTRY.register(gauges)
    await every(rt, REFRESH_S, partial(refresh, rt, gauges), "system gauges")
