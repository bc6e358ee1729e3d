"""One scenario run: its own servers (PostgreSQL, nats-server or a cluster of three), the whole stack over
them with every service's output in a file of its own, the fault's timing, and the row that results.

Logs outlive the run under VIDJOBS_FAULTS_LOGS (default: a `vidjobs-faults-logs` folder in the system temp
directory); everything else lives in a temporary directory removed at the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from tests.faults import backlog as backlogs
from tests.faults.backlog import Backlog
from tests.faults.collector import fill_row, wait_settled
from tests.faults.jsapi import wait_jetstream
from tests.faults.natsd import NatsCluster, NatsNode
from tests.faults.postgres import LocalPostgres
from tests.faults.probes import Answers, Probe
from tests.faults.replica import ReplicatedPostgres
from tests.faults.report import Row
from tests.faults.servicelogs import LoggingSupervisor
from tests.faults.workload import Created, create_jobs
from tests.stack import Stack, demo_key, running_stack, stack_settings
from vidjobs.common import db

if TYPE_CHECKING:
    from tests.faults.scenarios.plans import Plan

DATABASE = "vidjobs"
# Short recovery timings: the safety nets (recovery checks, redelivery) must act within a short run.
BASE_SETTINGS: dict[str, Any] = {
    "recovery_delay_s": 5, "recovery_interval_s": 5, "ack_wait_s": 10, "provider_timeout_s": 5,
    "render_deadline_s": 180, "log_format": "text",
}


def logs_root() -> Path:
    return Path(os.environ.get("VIDJOBS_FAULTS_LOGS", Path(tempfile.gettempdir()) / "vidjobs-faults-logs"))


@dataclass
class FaultRun:
    name: str
    home: Path
    log_dir: Path
    postgres: LocalPostgres | ReplicatedPostgres
    nats: NatsNode | None = None  # the single server, when not a cluster
    cluster: NatsCluster | None = None
    stack: Stack = field(init=False)
    row: Row = field(init=False)
    started: float = field(default_factory=time.monotonic)
    fault_end: datetime | None = None
    backlog: Backlog | None = None  # jobs parked beside the workload (tests.faults.backlog)

    def __post_init__(self) -> None:
        self.row = Row(self.name)

    @property
    def database_url(self) -> str:
        return self.postgres.url(DATABASE)

    @property
    def supervisor(self) -> LoggingSupervisor:
        return self.stack.supervisor  # type: ignore[return-value]

    def say(self, message: str) -> None:
        print(f"  [{self.name} t={time.monotonic() - self.started:5.1f}s] {message}", flush=True)

    async def settle(self, created: Created, within_s: float, stall_s: float) -> None:
        """Wait for the created jobs to end (or the wait to run out, or nothing to move for `stall_s`), then
        fill the row from the database."""
        self.row.refused = len(created.refused)
        self.row.expect(not created.refused, f"{len(created.refused)} creates never succeeded: {created.refused[:3]}")
        counts = await wait_settled(self.database_url, created.ids, within_s, stall_s=stall_s, say=self.say)
        self.say(f"settled: {dict(counts)}")
        await fill_row(self.row, self.database_url, self.stack.settings.fake_provider_url, created.ids, self.fault_end)
        restarted = {n: k - 1 for n, k in self.supervisor.starts.items() if k > 1}
        if restarted:
            self.row.notes.append(f"services the supervisor restarted (times): {restarted}")

    def expect_healthy_outcome(self) -> None:
        expect_healthy_outcome(self.row)

    def expect_answers_within(self, limit_s: float) -> None:
        """What a probed fault promises a client: an answer (any answer) within `limit_s`, and no 500."""
        row = self.row
        row.expect(row.slowest_s is not None, "the API was not probed during the fault")
        row.expect((row.slowest_s or 0.0) <= limit_s,
                   f"an API answer during the fault took {row.slowest_s:.1f}s (limit {limit_s:.0f}s)")
        row.expect(row.server_errors.get(500, 0) == 0, f"{row.server_errors.get(500)} answers were 500")

    def record(self, answers: Answers) -> None:
        self.row.slowest_s = answers.slowest_s
        self.row.server_errors = answers.server_errors
        statuses = dict(sorted(answers.statuses.items()))
        self.row.notes.append(f"probes during the fault: {answers.count} answers {statuses}; "
                              f"slowest {answers.slowest_s:.1f}s ({answers.slowest})")

    def expect_no_service_restarts(self) -> None:
        restarted = {n: k - 1 for n, k in self.supervisor.starts.items() if k > 1}
        self.row.expect(not restarted, f"services restarted (times): {restarted}")


def expect_healthy_outcome(row: Row) -> None:
    """What every scenario promises: its workload ran and every job of it completed; nothing stuck, failed or
    rendered twice, no move made twice. No scenario's workload cancels a job, so a job that ended any other
    way (canceled, expired: neither completed, failed nor stuck) is as broken as a failed one."""
    row.expect(row.created > 0, "the workload created no jobs: nothing was tried under the fault")
    row.expect(row.completed > 0, "no job completed")
    row.expect(row.stuck == 0, f"{row.stuck} jobs not terminal after the settle wait")
    row.expect(row.failed == 0, f"{row.failed} jobs failed (an infrastructure fault is not the job's)")
    ended_otherwise = row.created - row.completed - row.failed - row.stuck
    row.expect(ended_otherwise == 0, f"{ended_otherwise} jobs ended neither completed nor failed (canceled or "
                                     f"expired), though nothing canceled them")
    row.expect(row.over_rendered == 0, f"{row.over_rendered} jobs rendered more than once per attempt")
    row.expect(row.repeated_moves == 0, f"{row.repeated_moves} moves repeated within one attempt")


def blocking(call: Callable[[], object]) -> Callable[[], Awaitable[None]]:
    """A fault's beginning or end that blocks (a process killed or started, a directory made unusable), run
    on a thread so the workload goes on meanwhile."""
    async def on_a_thread() -> None:
        await asyncio.to_thread(call)
    return on_a_thread


async def under_fault(run: FaultRun, plan: Plan, *, begin: Callable[[], Awaitable[None]],
                      end: Callable[[], Awaitable[None]], probe: bool = False) -> Created:
    """Create the plan's workload; `plan.at_s` into it begin the fault, end it `plan.lasts_s` later; then let
    the jobs settle. With `probe`, a read and a create are sent back to back while the fault lasts, each
    answer timed (tests.faults.probes; the row's slowest_s and 5xx, see `expect_answers_within`)."""
    probes = Probe(run.stack) if probe else None
    if probes:
        await probes.start()
    creating = asyncio.create_task(create_jobs(run.stack, plan.workload()))
    try:
        await asyncio.sleep(plan.at_s)
        run.say("fault begins")
        await begin()
        if probes:
            probes.begin()
        await asyncio.sleep(plan.lasts_s)
        await end()
        run.fault_end = datetime.now(UTC)
        run.say("fault ends")
        if probes:
            await probes.end()
        created = await creating
    finally:
        creating.cancel()
    if probes:
        run.record(probes.answers)
        await probes.finish(created)
    run.say(f"{len(created.ids)} jobs created ({created.retries} create retries, {len(created.refused)} refused)")
    await run.settle(created, plan.settle_s, plan.stall_s)
    return created


async def _create_database(postgres: LocalPostgres | ReplicatedPostgres) -> None:
    conn = await asyncpg.connect(postgres.admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()


def _start_nats(home: Path, cluster: bool, *, advertise: bool = True) -> tuple[NatsNode | None, NatsCluster | None]:
    if cluster:
        return None, NatsCluster(home / "nats", advertise=advertise).start()
    return NatsNode(home / "nats").start(), None


def _stop_servers(run: FaultRun) -> None:
    for stop in (run.nats and run.nats.stop, run.cluster and run.cluster.stop, run.postgres.stop):
        if stop:
            with contextlib.suppress(Exception):
                stop()


def _keep_server_logs(run: FaultRun) -> None:
    servers = [*run.home.glob("nats/**/nats.log"), *run.home.glob("pg*/postgres.log"), *run.home.glob("**/moto.log")]
    for log in servers:
        if log.exists():
            shutil.copy(log, run.log_dir / f"{log.parent.name}-{log.name}")


def _with_full_quota(overrides: dict[str, Any]) -> dict[str, Any]:
    """The settings with the backlog's provider given no render slot (beside any limits the scenario sets)."""
    return {**overrides, "provider_limits": {**overrides.get("provider_limits", {}), **backlogs.FULL_QUOTA}}


@contextlib.asynccontextmanager
async def fault_run(name: str, *, cluster: bool = False, every_url: bool = False,
                    limits: dict[str, Any] | None = None, backlog: int | None = None,
                    services: dict[str, str] | None = None,
                    postgres: Callable[[Path], LocalPostgres | ReplicatedPostgres] = LocalPostgres,
                    via: Callable[[str], str] | None = None, **overrides: Any) -> AsyncIterator[FaultRun]:
    """A FaultRun with the stack up. The services get one NATS URL: the single server's, or a cluster's first
    node (the client learns the other nodes from the server), or with `every_url` all of a cluster's nodes,
    as a deployment lists them. `limits` shape the test account (see tests.stack.demo_key). `backlog` jobs
    (default: VIDJOBS_FAULTS_BACKLOG) are parked on another provider before the scenario begins, and checked
    intact once it has ended. `services` names the service processes (default: one of each, as `vidjobs up`
    runs them). `postgres` makes the database server(s) in a folder (a primary and its standby:
    tests.faults.replica). `via` rewrites the servers' URLs the services are given (to put a proxy between:
    the harness itself reaches the servers directly)."""
    size = backlogs.configured_size() if backlog is None else backlog
    if size:
        overrides = _with_full_quota(overrides)
    home = Path(tempfile.mkdtemp(prefix=f"vidjobs-faults-{name}-"))
    log_dir = logs_root() / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    log_dir.mkdir(parents=True, exist_ok=True)
    run = FaultRun(name, home, log_dir, postgres(home / "pg"))
    try:
        run.postgres.init().start()
        await _create_database(run.postgres)
        # Given every node's URL, the services need no advertised ones (which would go round a `via` proxy).
        run.nats, run.cluster = _start_nats(home, cluster, advertise=not every_url)
        if run.cluster:
            await wait_jetstream(run.cluster.urls)
        seed = run.nats.url if run.nats else run.cluster.urls[0]  # type: ignore[union-attr]
        if run.cluster and every_url:
            seed = ",".join(run.cluster.urls)
        route = via or (lambda url: url)
        settings = stack_settings(home, route(run.database_url), route(seed), **{**BASE_SETTINGS, **overrides})
        await db.migrate(run.database_url)
        key = await demo_key(run.database_url, **(limits or {}))
        factory = partial(LoggingSupervisor, log_dir=log_dir)
        body_done = False
        try:
            async with running_stack(settings, key=key, services=services, supervisor_factory=factory) as stack:
                run.stack = stack
                run.say(f"stack up; logs in {log_dir}")
                if size:
                    run.backlog = await backlogs.queue(run.database_url, size, say=run.say,
                                                       recovery_delay_s=settings.recovery_delay_s)
                yield run
                body_done = True
                if run.backlog is not None:
                    await backlogs.check(run.row, settings, run.backlog)
        except AssertionError as exc:
            if not body_done:
                raise
            # The stack's own exit check failed: some job's audit trail holds an illegal move.
            run.row.expect(False, f"illegal audit trail: {str(exc)[:300]}")
    finally:
        run.row.elapsed_s = time.monotonic() - run.started
        _stop_servers(run)
        _keep_server_logs(run)
        shutil.rmtree(home, ignore_errors=True)
