"""One nemesis run: servers of its own (PostgreSQL, a three-node NATS cluster, moto for S3), the whole stack
over them with two of each worker, the load and the seed's fault schedule together for the run's length,
then every fault healed, the jobs let settle, and the whole history checked. The seed is printed first: the
same seed replays the same schedule and the same load's choices."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import botocore.session
from botocore.config import Config

from tests.faults import quiescence
from tests.faults.checker import check_history
from tests.faults.collector import fill_row, wait_settled
from tests.faults.harness import FaultRun, fault_run
from tests.faults.history import History
from tests.faults.nemesis import schedule
from tests.faults.nemesis.catalogue import Catalogue
from tests.faults.nemesis.load import ENDPOINT_MODES, Load, Receivers, Tally
from tests.faults.nemesis.network import Network
from tests.faults.objectstore import RestartableMoto, running_moto
from tests.faults.replica import ReplicatedPostgres
from tests.faults.report import Row
from tests.faults.s3front import S3Front
from tests.stack import demo_key, host_port
from vidjobs.cli.supervisor import SERVICES

S3_ENDPOINT = "AWS_ENDPOINT_URL_S3"  # wins over AWS_ENDPOINT_URL, which points at moto itself
BUCKET = "vidjobs-nemesis"
EXPORTS = "nemesis-exports"  # the accounts' own bucket, where exports go
WORKERS = ("submitter", "poller", "media", "reaper")
ACCOUNT_MODES = ("answers", "answers", "fails", "hangs")  # one account per entry, by its endpoint's mode
SETTINGS = {
    "app_webhook_retry_s": "0.5,1,2,4", "app_webhook_timeout_s": 2.0, "render_deadline_s": 90,
    "retry_base_s": 0.5, "retry_cap_s": 5.0,  # a failed attempt's next one comes within the settle wait
    # A render's last callback lost (its provider's retries all landed in a fault): found at the next check,
    # which a callback before it put this far away (120 s by default, for renders of minutes).
    "recovery_quiet_s": 10.0,
}
SETTLE_S = 150.0  # after the load and the faults, how long the jobs get to end
STALL_S = 45.0  # settling stops early once no job has moved for this long
QUIESCENT_WITHIN_S = 60.0  # then everything else (events, deliveries, deleted files) gets this long


@dataclass
class Outcome:
    seed: int
    seconds: float
    plan: list[schedule.Planned]
    history: History
    row: Row
    statuses: Counter = field(default_factory=Counter)
    begun: list[str] = field(default_factory=list)  # faults as they began, with the moment
    killed: Counter = field(default_factory=Counter)  # SIGKILLs the run sent, by service
    tally: Tally = field(default_factory=Tally)
    violations: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations and self.row.passed


def services() -> dict[str, str]:
    """Every service as `vidjobs up` runs it, and a second process of each worker, as a deployment runs them."""
    return {**SERVICES, **{f"{name}-2": SERVICES[name] for name in WORKERS}}


def targets(run: FaultRun) -> schedule.Targets:
    assert run.cluster is not None
    return schedule.Targets(
        workers=tuple(n for n in services() if n.split("-")[0] in WORKERS),
        gateway=("gateway",), nats_nodes=tuple(node.name for node in run.cluster.nodes))


async def nemesis(seed: int, minutes: float, *, every_s: float = 0.25) -> Outcome:
    """One run; the load draws an action every `every_s` on average."""
    seconds = minutes * 60
    history = History(seed)
    async with (Receivers(history).serving(len(ACCOUNT_MODES)) as receivers, running_moto(BUCKET) as moto,
                S3Front(moto.endpoint).running() as front):
        assert moto.server is not None
        moto.server.create_bucket(EXPORTS)
        with _s3_endpoint(front.url), contextlib.closing(Network()) as net:
            async with fault_run("nemesis", via=net.via, cluster=True, every_url=True, backlog=0, services=services(),
                                 postgres=partial(ReplicatedPostgres, synchronous=True),
                                 storage_url=f"s3://{BUCKET}/nemesis",
                                 webhook_allow_hosts=",".join(host_port(base) for base in receivers.bases),
                                 export_allow_hosts=host_port(moto.endpoint), **SETTINGS) as run:
                plan = schedule.make(seed, seconds, targets(run))
                outcome = Outcome(seed, seconds, plan, history, run.row)
                run.say(f"nemesis seed {seed}, {minutes:g} min, {len(plan)} faults: {schedule.counted(plan)}")
                await _run(run, moto, front, net, receivers, outcome, every_s)
    return outcome


@contextlib.contextmanager
def _s3_endpoint(url: str) -> Iterator[None]:
    """The services reach S3 through the front (their environment is this process's, copied as each starts)."""
    before = os.environ.get(S3_ENDPOINT)
    os.environ[S3_ENDPOINT] = url
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(S3_ENDPOINT, None)
        else:
            os.environ[S3_ENDPOINT] = before


async def _run(run: FaultRun, moto: RestartableMoto, front: S3Front, net: Network, receivers: Receivers,
               outcome: Outcome, every_s: float) -> None:
    rng = random.Random(outcome.seed)
    load = Load(run.stack.url, run.stack.session, outcome.history, rng, receivers, export_url=_presigner(moto))
    for mode in ACCOUNT_MODES:
        assert mode in ENDPOINT_MODES
        await load.add_account(await demo_key(run.database_url), mode)
    catalogue = Catalogue(run.supervisor, run.postgres, run.cluster, moto, front,  # type: ignore[arg-type]
                          run.stack.settings.fake_provider_url, run.stack.session, net)
    outcome.tally = load.tally
    outcome.history.began_at = None  # every account was made for the run: all its settlements count
    playing = asyncio.create_task(_play(outcome, catalogue, run))
    try:
        await load.run_for(outcome.seconds, every_s=every_s)
        await playing
    finally:
        playing.cancel()
        await catalogue.heal()
    run.say(f"load over: {len(outcome.history.acknowledged)} jobs acknowledged; calls {outcome.tally.calls}")
    await _settle(run, outcome, answering={a.endpoint_id for a in load.accounts if a.mode == "answers"})


async def _play(outcome: Outcome, catalogue: Catalogue, run: FaultRun) -> None:
    began = time.monotonic()

    async def one(fault: schedule.Planned) -> None:
        await asyncio.sleep(max(0.0, began + fault.at_s - time.monotonic()))
        outcome.begun.append(f"t={time.monotonic() - began:6.1f}s {fault.kind} {fault.target}")
        if fault.kind in ("kill_service", "kill_gateway"):
            outcome.killed[fault.target] += 1
        run.say(f"fault: {fault}")
        await catalogue.begin(fault)
        await asyncio.sleep(fault.lasts_s)
        await catalogue.end(fault)

    await asyncio.gather(*(one(fault) for fault in outcome.plan))


def _presigner(moto: RestartableMoto):  # type: ignore[no-untyped-def]
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=moto.endpoint, region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))

    def presigned_put() -> str:
        return client.generate_presigned_url("put_object", ExpiresIn=3600,
                                             Params={"Bucket": EXPORTS, "Key": f"{secrets.token_hex(6)}.mp4"})
    return presigned_put


async def _settle(run: FaultRun, outcome: Outcome, *, answering: set[str]) -> None:
    """Let the jobs end, wait for quiescence (deliveries to the endpoints that fail or hang by design retry on:
    the checker accepts them pending), then check the whole history."""
    history = outcome.history
    ids = [job for job in history.acknowledged if job not in history.deleted]
    outcome.statuses = await wait_settled(run.database_url, ids, SETTLE_S, stall_s=STALL_S, say=run.say)
    run.say(f"settled: {dict(outcome.statuses)}")
    await fill_row(run.row, run.database_url, run.stack.settings.fake_provider_url, ids, None)
    given_up = outcome.tally.given_up
    run.row.expect(not given_up, f"{len(given_up)} calls never answered but 429 or 5xx: {given_up[:3]}")
    try:
        await quiescence.settle(run, history, within_s=QUIESCENT_WITHIN_S, answering=answering)
    except AssertionError as exc:
        stuck = await quiescence.pending_deliveries(run, answering)
        outcome.violations.append(f"[quiescence] (seed {outcome.seed}): {exc}; deliveries pending: {stuck}")
    run.say("quiescent; checking the whole history")
    found = await check_history(run, history, killed=dict(outcome.killed))
    outcome.violations += [str(v) for v in found]
    run.say(f"checked: {len(found)} violations")


def report(outcome: Outcome) -> str:
    history = outcome.history
    lines = [
        f"nemesis seed {outcome.seed}: {outcome.seconds / 60:g} min of load, "
        f"{len(outcome.plan)} faults {schedule.counted(outcome.plan)}",
        f"  jobs acknowledged {len(history.acknowledged)}, canceled {len(history.canceled)}, "
        f"deleted {len(history.deleted)}; by status at the end {dict(sorted(outcome.statuses.items()))}",
        f"  app webhook deliveries received {len(history.received)}; "
        f"calls {dict(sorted(outcome.tally.calls.items()))}",
        f"  {'PASS' if outcome.passed else 'FAIL'}: {len(outcome.violations)} violations, "
        f"row {'ok' if outcome.row.passed else 'broken'}",
    ]
    lines += [f"  violation: {v}" for v in outcome.violations]
    lines += [f"  broken: {b}" for b in outcome.row.broken]
    lines += [f"  note: {n}" for n in outcome.row.notes]
    return "\n".join(lines)
