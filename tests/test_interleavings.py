"""Random interleavings against one job at a time, through the production handlers: provider signals (applied
directly or stored as callbacks and read by the inbox consumer), polls, recovery checks, owner cancels, the
submitter, the media service's last step, deletion, redeliveries and races, over a real PostgreSQL, a real
nats-server and the fake provider over HTTP.

Whatever the order, the job's record must tell a legal story (docs/ARCHITECTURE.md "Job states", "Recovery"): its audit
trail is a chain of legal moves, nothing moves after a terminal status, the attempt never goes back, a
finished job is not watched any more while a live one always is, and its credit reservation is released
exactly once. Hypothesis prints the failing sequence of steps; the ops in a step run concurrently.

The tests after the property pin down, step by step, interleavings that once went wrong: a signal judged
against a row read before a slow provider answer, a render accepted after its job was canceled, and a callback
for a retried job dropped because the row kept the previous attempt's render.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import aiohttp
import msgspec
import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from tests.stack import assert_legal_trail
from tests.support import wait_until
from vidjobs.common import bus, creation, credits, deletion, events, jobs, outbox, renders
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ErrorCode, JobError, ProviderError, Redeliver
from vidjobs.common.events import CancelRequested, InboxReceived, JobQueued, RecoveryDue
from vidjobs.common.jobs import JobRequest, JobRow
from vidjobs.common.renders import Outputs, StoredFile
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime, open_runtime
from vidjobs.common.settings import Settings
from vidjobs.common.signatures import new_secret
from vidjobs.common.states import TERMINAL, JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.fakeprovider.scenarios import REFUSALS_PER_JOB, FakeProvider
from vidjobs.fakeprovider.serving import running_fake_provider
from vidjobs.fakeprovider.wire import RenderStatus
from vidjobs.media import assets
from vidjobs.poller import worker as poller
from vidjobs.poller.signals import LearnedBy, SignalContext, apply_signal
from vidjobs.providers.base import ProviderAdapter, ProviderSignal, ProviderState
from vidjobs.providers.registry import adapter_for, build_adapters
from vidjobs.reaper import recovery
from vidjobs.storage.filesystem import FileStorage
from vidjobs.submitter import worker as submitter

ESTIMATE = 10
BALANCE = 1_000
MAX_ATTEMPTS = 3
# The provider's own words for our codes, as a stored callback carries them (libs/providers/fake/adapter.py).
PROVIDER_CODE = {
    ErrorCode.PROVIDER_UNAVAILABLE: "render_failed",
    ErrorCode.CONTENT_REJECTED: "content_policy_violation",
    ErrorCode.TIMEOUT: "render_timeout",
}
# Queued last: it moves nothing, and generation favours the first choices.
STATES = [ProviderState.RUNNING, ProviderState.SUCCEEDED, ProviderState.FAILED, ProviderState.CANCELED,
          ProviderState.QUEUED]
_webhook_ids = itertools.count()


# --- the operations ------------------------------------------------------------------------------------

# How the fake provider treats the example's job: renders that never finish (so only the test's signals end
# them), submits refused twice first (pending -> retrying, with and without spending an attempt), or a prompt
# its moderation refuses at once.
SCENARIOS = ("hang", "unavailable_then_succeed", "rate_limit_then_succeed", "content_rejected")

Aim = Literal["current", "older_attempt", "other_render", "no_attempt"]


@dataclass(frozen=True)
class Signal:
    """A provider signal about the job's current attempt (or, per `aim`, a stale one), `times` deliveries."""

    state: ProviderState
    progress: float | None = None
    error: ErrorCode | None = None
    with_output: bool = True
    aim: Aim = "current"
    door: Literal["apply", "inbox"] = "apply"
    times: int = 1


@dataclass(frozen=True)
class Poll:
    """The poller asks the fake provider about the job."""


@dataclass(frozen=True)
class Recovery:
    """Time passes to the job's recover_at (and its deadline, if `deadline_passed`); the check is delivered."""

    deliveries: int = 1
    deadline_passed: bool = False


@dataclass(frozen=True)
class Cancel:
    """The owner cancels."""


@dataclass(frozen=True)
class Submit:
    """The submitter handles a JobQueued for the job."""


@dataclass(frozen=True)
class Media:
    """The media service's last step: the render stored and verified, or the download given up on."""

    ok: bool = True


@dataclass(frozen=True)
class Delete:
    """The owner deletes the job."""


@dataclass(frozen=True)
class Hold:
    """A consumer reads the row and is then held up; `Late` applies a signal with that row."""


@dataclass(frozen=True)
class Late:
    """The held consumer goes on: a signal current for the row it read, judged against that row."""

    signal: Signal


Op = Signal | Poll | Recovery | Cancel | Submit | Media | Delete | Hold | Late


@st.composite
def signals(draw: st.DrawFn, doors: tuple[str, ...] = ("apply", "inbox")) -> Signal:
    state = draw(st.sampled_from(STATES))
    return Signal(
        state=state,
        progress=draw(st.sampled_from([None, 0.25, 0.5])) if state is ProviderState.RUNNING else None,
        error=draw(st.sampled_from(list(PROVIDER_CODE))) if state is ProviderState.FAILED else None,
        with_output=draw(st.sampled_from([True, True, False])) if state is ProviderState.SUCCEEDED else True,
        aim=draw(st.sampled_from(["current"] * 4 + ["older_attempt", "other_render", "no_attempt"])),
        door=draw(st.sampled_from(doors)),
        times=draw(st.sampled_from([1, 1, 2])),
    )


def _weighted(*pairs: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    # `one_of` would fold repeated branches into one; drawing from a list with repeats keeps the weights.
    return st.sampled_from([s for weight, s in pairs for _ in range(weight)]).flatmap(lambda s: s)


ops = _weighted(
    (8, signals()),
    (3, st.just(Submit())),
    (3, st.builds(Recovery, deliveries=st.sampled_from([1, 2]), deadline_passed=st.booleans())),
    (2, st.just(Poll())),
    (3, st.builds(Media, ok=st.sampled_from([True, True, False]))),
    (1, st.just(Cancel())),
    (1, st.just(Hold())),
)
# A few ops race in one step; a held consumer's late signal and a deletion each take a step of their own.
steps = st.lists(
    _weighted(
        (12, st.lists(ops, min_size=1, max_size=3).map(tuple)),
        (2, st.builds(Late, signal=signals(doors=("apply",))).map(lambda op: (op,))),
        (1, st.just((Delete(),))),
    ),
    min_size=2, max_size=14,
)


# --- the world: one runtime, one fake provider, the production contexts -------------------------------


class World:
    def __init__(self, rt: Runtime, provider: FakeProvider, adapters: dict[str, ProviderAdapter]):
        policies = Policies(rt.settings)
        self.rt, self.provider = rt, provider
        self.signals = SignalContext(rt=rt, policies=policies)
        self.poller = poller.Context(rt=rt, adapters=adapters, signals=self.signals)
        # No job here has an input image, so nothing is ever signed; the storage is only there to be complete.
        storage = FileStorage(Path(rt.settings.data_dir) / "objects", base_url=rt.settings.gateway_url, secret="s")
        self.submitter = submitter.Context(rt=rt, adapters=adapters, policies=policies, storage=storage)
        self.reaper = recovery.Context(rt=rt, policies=policies)

    def __repr__(self) -> str:
        return "World(...)"  # a failing example prints its steps, not every setting


@pytest.fixture
async def world(database_url: str, nats_url: str, tmp_path: Path) -> AsyncIterator[World]:
    secret = new_secret()
    async with running_fake_provider(webhook_secret=secret, callback_attempts=1) as provider:
        config = Settings().with_(
            data_dir=str(tmp_path), database_url=database_url, nats_url=nats_url,
            fake_provider="on", fake_provider_url=provider.url, fake_webhook_secret=secret,
            public_url="http://127.0.0.1:9",  # callbacks go nowhere: this test delivers them itself
            max_attempts=MAX_ATTEMPTS, retry_base_s=0.05, retry_cap_s=0.2, provider_timeout_s=5,
        )
        async with open_runtime("interleavings", config) as rt, aiohttp.ClientSession() as session:
            yield World(rt, provider, build_adapters(config, session))


# --- one example: a fresh job, the steps, and the checks after each -----------------------------------


@dataclass
class Run:
    world: World
    job_id: str
    account_id: str
    renders: dict[int, str] = field(default_factory=dict)  # attempt -> the provider's render id
    held: JobRow | None = None
    attempt: int = 1

    @property
    def pool(self):
        return self.world.rt.pool

    async def job(self) -> JobRow:
        job = await jobs.fetch(self.pool, self.job_id)
        assert job is not None
        return job

    async def trail(self) -> list[dict]:
        rows = await self.pool.fetch(
            "SELECT from_status, to_status, reason FROM job_transitions WHERE job_id = $1 ORDER BY id", self.job_id)
        return [{"from": r["from_status"], "to": r["to_status"], "reason": r["reason"]} for r in rows]


async def new_run(world: World, scenario: str = "hang") -> Run:
    account_id = f"acct_{secrets.token_hex(6)}"
    async with world.rt.tx() as conn:
        await conn.execute("INSERT INTO accounts (id, name) VALUES ($1, $1)", account_id)
        await credits.grant(conn, account_id, BALANCE, "test credit")
    request = JobRequest(model="fake/default", prompt="a fox in snow", duration_s=1, seed=7,
                         params={"scenario": scenario, "render_s": 600})
    async with world.rt.tx() as conn:
        job = await creation.create(conn, account_id=account_id, request=request, estimated_credits=ESTIMATE,
                                    recovery_delay_s=world.rt.settings.recovery_delay_s)
    return Run(world=world, job_id=job.id, account_id=account_id)


async def legal_answer(call: Awaitable[object]) -> None:
    """Run a handler; a request to be delivered again later is a legal answer."""
    try:
        await call
    except Redeliver:
        pass


async def run_step(run: Run, step: tuple[Op, ...]) -> None:
    outcomes = await asyncio.gather(*(run_op(run, op) for op in step), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def run_op(run: Run, op: Op) -> None:
    match op:
        case Signal():
            await signal(run, op)
        case Poll():
            await legal_answer(poller.poll_once(run.world.poller, run.job_id, source="poll",
                                                learned_by=LearnedBy.REQUESTED_POLL))
        case Recovery():
            await recovery_check(run, op)
        case Cancel():
            await owner_cancel(run)
        case Submit():
            event = JobQueued(job_id=run.job_id)
            await legal_answer(submitter.handle(run.world.submitter, event, Delivery(1, events.SUBMIT)))
        case Media():
            await media_ends(run, op.ok)
        case Delete():
            async with run.world.rt.tx() as conn:
                await deletion.soft_delete(conn, run.job_id, run.account_id)
        case Hold():
            run.held = await run.job()
        case Late():
            await late_signal(run, op.signal)


async def render_of(run: Run, job: JobRow) -> str:
    """The provider's render for the job's current attempt. Asked for with the submitter's own idempotency
    key, so a signal can name the render before the submitter has recorded it, and the two always agree."""
    if job.attempt not in run.renders:
        ctx = run.world.submitter
        adapter = adapter_for(ctx.adapters, job.provider)
        req = await submitter.submit_request(ctx, job, adapter)
        for refusals_left in range(REFUSALS_PER_JOB, -1, -1):
            try:
                accepted = await adapter.submit(req)
                break
            except ProviderError:
                if not refusals_left:  # more than the scenario refuses
                    raise
        run.renders.setdefault(job.attempt, accepted.provider_job_id)
    return run.renders[job.attempt]


async def provider_signal(run: Run, job: JobRow, op: Signal) -> ProviderSignal:
    attempt: int | None = job.attempt
    render = await render_of(run, job)
    match op.aim:
        case "older_attempt":
            attempt = job.attempt - 1
            render = run.renders.get(attempt, f"rnd_gone_{job.id}")
        case "other_render":
            render = f"rnd_other_{job.id}"
        case "no_attempt":
            attempt = None  # a provider that does not echo the attempt back
    output = f"{run.world.rt.settings.fake_provider_url}/outputs/{render}.mp4"
    return ProviderSignal(
        provider_job_id=render, state=op.state, job_id=job.id, attempt=attempt, progress=op.progress,
        output_url=output if op.state is ProviderState.SUCCEEDED and op.with_output else None,
        error=JobError.of(op.error) if op.error else None,
    )


async def signal(run: Run, op: Signal) -> None:
    sig = await provider_signal(run, await run.job(), op)
    if op.door == "inbox":
        inbox_id = await store_callback(run, sig)
        for attempt in range(1, op.times + 1):
            delivery = Delivery(attempt, events.INBOX)
            await legal_answer(poller.on_inbox(run.world.poller, InboxReceived(inbox_id, "fake"), delivery))
        return
    for _ in range(op.times):
        # A redelivered message is handled afresh: the consumer rereads the row.
        await legal_answer(apply_signal(run.world.signals, await run.job(), sig, source="callback",
                                        learned_by=LearnedBy.CALLBACK))


async def store_callback(run: Run, sig: ProviderSignal) -> int:
    """The callback as the fake provider sends it, stored raw without its parsed signal, as a gateway of the
    release before stored it: the poller parses it (tests/test_callbacks_parsed_once.py covers the stored signal)."""
    error = None if sig.error is None else {"code": PROVIDER_CODE[sig.error.code], "message": "from the test"}
    body = {"type": f"render.{sig.state.value}", "data": {
        "id": sig.provider_job_id, "status": sig.state.value, "progress": sig.progress,
        "output_url": sig.output_url, "error": error, "metadata": {"job_id": sig.job_id, "attempt": sig.attempt},
    }}
    return await run.pool.fetchval(
        "INSERT INTO webhook_inbox (provider, webhook_id, payload) VALUES ('fake', $1, $2) RETURNING id",
        f"msg_test_{next(_webhook_ids)}", msgspec.json.encode(body),
    )


async def recovery_check(run: Run, op: Recovery) -> None:
    # Time passes (test setup, not a status change): the check comes due, a backoff ends, an earlier
    # reaper's lease runs out and, if asked, the stage deadline passes.
    due = await run.pool.fetchval(
        """
        UPDATE jobs SET recover_at = now() - interval '1 second',
            retry_at = CASE WHEN retry_at IS NULL THEN NULL ELSE now() - interval '1 second' END,
            deadline_at = CASE WHEN $2 AND deadline_at IS NOT NULL THEN now() - interval '1 second'
                          ELSE deadline_at END
        WHERE id = $1 AND recover_at IS NOT NULL
        RETURNING recover_at
        """,
        run.job_id, op.deadline_passed,
    )
    await run.pool.execute("UPDATE recovery_leases SET expires_at = now() - interval '1 second' WHERE job_id = $1",
                           run.job_id)
    event = RecoveryDue(job_id=run.job_id, due_at=due or datetime.now(UTC))
    await asyncio.gather(*(
        legal_answer(recovery.on_recovery_due(run.world.reaper, event, Delivery(n, events.RECOVERY)))
        for n in range(1, op.deliveries + 1)
    ))


async def owner_cancel(run: Run) -> None:
    """As the gateway's cancel route does it."""
    async with run.world.rt.tx() as conn:
        moved = await transition(conn, run.job_id, JobStatus.CANCELED, reason="canceled by owner",
                                 update=JobUpdate(error=JobError.of(ErrorCode.CANCELED)))
        if moved is not None:
            await outbox.add(conn, jobs.stop_at_provider(moved.job, was=moved.from_status))


async def media_ends(run: Run, ok: bool) -> None:
    """As the media service ends a download: completed with its outputs, or failed."""
    async with run.world.rt.tx() as conn:
        if ok:
            outputs = Outputs(
                video=StoredFile(key=f"{run.job_id}/video.mp4", content_type="video/mp4", bytes=1234,
                                 sha256="0" * 64, width=1280, height=720, duration_s=1.0),
                thumbnail=StoredFile(key=f"{run.job_id}/thumb.jpg", content_type="image/jpeg", bytes=12,
                                     sha256="1" * 64))
            done = await transition(conn, run.job_id, JobStatus.COMPLETED,
                                    reason="render stored, verified and thumbnailed",
                                    expect=[JobStatus.DOWNLOADING], update=JobUpdate(progress=None))
            if done is not None:
                await assets.upsert(conn, run.job_id, done.job.account_id, outputs)
        else:
            error = JobError.of(ErrorCode.DOWNLOAD_FAILED)
            await transition(conn, run.job_id, JobStatus.FAILED, reason="media: download_failed",
                             expect=[JobStatus.DOWNLOADING], update=JobUpdate(error=error, progress=None))


async def late_signal(run: Run, op: Signal) -> None:
    """A signal that was current for the held row, applied with that row (as the inbox consumer applies the
    row it read before it was held up). Once the job has moved to another attempt or render, it is stale."""
    held = run.held
    if held is None:
        return
    sig = await provider_signal(run, held, op)
    await legal_answer(apply_signal(run.world.signals, held, sig, source="callback",
                                    learned_by=LearnedBy.CALLBACK))


# --- the properties ------------------------------------------------------------------------------------


def say(text: str) -> None:
    """Printed with a failing example; the step-by-step tests below run outside Hypothesis."""
    if currently_in_test_context():
        note(text)


async def check_row(run: Run) -> None:
    """What must hold of the row after every step."""
    job = await run.job()
    deleted = job.deleted_at is not None
    say(f"  -> {job.status.value} attempt={job.attempt} render={job.provider_job_id} deleted={deleted}")
    assert job.attempt >= run.attempt, f"attempt went back from {run.attempt} to {job.attempt}"
    assert job.attempt <= MAX_ATTEMPTS, f"attempt {job.attempt} is past the budget of {MAX_ATTEMPTS}"
    run.attempt = job.attempt
    if job.status in TERMINAL:
        watched = (job.recover_at, job.retry_at, job.deadline_at)
        assert watched == (None, None, None), f"a finished job is still watched: {job}"
    elif job.deleted_at is not None:
        assert job.recover_at is None, f"a deleted job is still scheduled for recovery: {job}"
    elif job.status is JobStatus.PENDING and job.recover_at is None:
        # Parked: it waits for a slot, and the event that frees one (or the queue sweep) hands it one.
        assert job.wait_reason and job.waited_at is not None, f"a pending job neither parked nor watched: {job}"
    else:
        assert job.recover_at is not None, f"a live {job.status} job has no recovery due time"
    if job.status is JobStatus.RETRYING:
        assert job.retry_at is not None and job.error is not None and job.error.retryable, job
    if job.status in (JobStatus.FAILED, JobStatus.CANCELED):
        assert job.error is not None, f"{job.status} without an error"
    if job.status is JobStatus.CANCELED:
        assert job.error.code is ErrorCode.CANCELED, job.error
    if job.status is JobStatus.COMPLETED:
        assert await renders.read(run.world.rt.pool, job.id) is not None, "completed without outputs"
    await check_credits(run, job)


async def check_credits(run: Run, job: JobRow) -> None:
    row = await run.pool.fetchrow("SELECT credits_balance, credits_reserved FROM accounts WHERE id = $1",
                                  run.account_id)
    assert row["credits_reserved"] >= 0, f"credits went negative: {dict(row)}"
    reserved = 0 if job.finished else ESTIMATE
    # A finished job owes what its actual cost says: a delivered render, or one the provider billed for.
    charged = (job.actual_credits or 0) if job.finished else 0
    assert charged <= ESTIMATE, f"charged {charged} above the estimate {ESTIMATE}"
    assert (row["credits_balance"], row["credits_reserved"]) == (BALANCE - charged, reserved), (
        f"{job.status} job (deleted: {job.deleted_at is not None}) left the account at {dict(row)}")
    ledger = await run.pool.fetchrow(
        "SELECT sum(balance_change) AS balance, sum(reserved_change) AS reserved FROM credit_ledger "
        "WHERE account_id = $1", run.account_id)
    assert (ledger["balance"], ledger["reserved"]) == (row["credits_balance"], row["credits_reserved"]), (
        f"the ledger does not explain the account: {dict(ledger)} vs {dict(row)}")


def check_trail(trail: list[dict]) -> None:
    say(f"trail: {[(m['from'], m['to'], m['reason']) for m in trail]}")
    assert trail and (trail[0]["from"], trail[0]["to"]) == (None, "pending"), trail
    assert_legal_trail(trail)
    statuses = [m["to"] for m in trail]
    for i, status in enumerate(statuses):
        assert i == 0 or status != statuses[i - 1], f"{status} entered twice in a row: {statuses}"
        if JobStatus(status) in TERMINAL:
            assert i == len(statuses) - 1, f"the job moved after it ended in {status}: {statuses}"


# --- the test ------------------------------------------------------------------------------------------

RETRIED = (
    (Submit(),), (Signal(ProviderState.FAILED, error=ErrorCode.PROVIDER_UNAVAILABLE),), (Recovery(),), (Submit(),),
)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenario=st.sampled_from(SCENARIOS), steps=steps)
# The callback beats the submit answer while the owner cancels; a redelivered success comes late.
@example(scenario="hang", steps=[
    (Signal(ProviderState.RUNNING, progress=0.25), Submit(), Cancel()),
    (Signal(ProviderState.SUCCEEDED, door="inbox", times=2),), (Media(),),
])
# Two doors report success at once; completion races a recovery check, then the owner's cancel comes late.
@example(scenario="hang", steps=[
    (Submit(),), (Signal(ProviderState.SUCCEEDED), Signal(ProviderState.SUCCEEDED, door="inbox")),
    (Media(), Recovery(deliveries=2)), (Cancel(), Media(ok=False)),
])
# A retried job: the old attempt's late success and a duplicate recovery check race the new attempt.
@example(scenario="hang", steps=[
    *RETRIED, (Signal(ProviderState.SUCCEEDED, aim="older_attempt"), Recovery(deliveries=2)),
])
# Refused submits: a rate limit spends no attempt, an outage does.
@example(scenario="rate_limit_then_succeed", steps=[(Submit(),), (Recovery(),), (Submit(),), (Recovery(),)])
@example(scenario="unavailable_then_succeed", steps=[(Submit(), Submit()), (Recovery(deliveries=2),), (Submit(),)])
# Consumers that read the row at attempt 1 and apply their signal after the job was retried.
@example(scenario="hang", steps=[
    (Submit(),), (Hold(),), *RETRIED[1:], (Late(Signal(ProviderState.FAILED, error=ErrorCode.TIMEOUT)),),
])
@example(scenario="hang", steps=[(Hold(),), (Submit(),), *RETRIED[1:3], (Late(Signal(ProviderState.RUNNING)),)])
async def test_any_interleaving_leaves_a_legal_record(world: World, scenario: str, steps: list[tuple[Op, ...]]):
    run = await new_run(world, scenario)
    for step in steps:
        say(f"step {step}")
        await run_step(run, step)
        await check_row(run)
    check_trail(await run.trail())


# --- interleavings that once went wrong, pinned step by step ----------------------------------------------


class LateAnswers:
    """The real adapter, except that the answer to `method` reaches us only once `release` is set: the
    provider did the work at once, and its answer is slow on the way back."""

    def __init__(self, inner: ProviderAdapter, method: str):
        self.inner, self.method = inner, method
        self.answered, self.release = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str):
        found = getattr(self.inner, name)
        if name != self.method:
            return found

        async def late(*args, **kwargs):
            answer = await found(*args, **kwargs)
            self.answered.set()
            await self.release.wait()
            return answer

        return late


async def run_steps(run: Run, steps: list[tuple[Op, ...]]) -> None:
    for step in steps:
        await run_step(run, step)
        await check_row(run)


async def test_a_late_poll_answer_about_the_first_attempt_leaves_the_second_alone(world: World):
    run = await new_run(world)
    await run_steps(run, [(Submit(),)])
    first = await run.job()
    await world.poller.adapters["fake"].cancel(first.provider_job_id)  # the provider stops the first render
    late = LateAnswers(world.poller.adapters["fake"], "status")
    poll = asyncio.create_task(poller.poll_once(
        poller.Context(rt=world.rt, adapters={"fake": late}, signals=world.signals), run.job_id, source="poll",
        learned_by=LearnedBy.REQUESTED_POLL))
    await late.answered.wait()
    # While "canceled" is on its way to the poller, the callback saying so retries the job as attempt 2.
    await run_steps(run, [(Signal(ProviderState.CANCELED, door="inbox"),), (Recovery(),), (Submit(),)])
    second = await run.job()
    assert (second.status, second.attempt) == (JobStatus.SUBMITTED, 2)
    late.release.set()
    await poll
    now = await run.job()
    assert (now.status, now.attempt, now.provider_job_id) == (second.status, 2, second.provider_job_id), (
        f"attempt 1's answer moved attempt 2: {(await run.trail())[-1]}")


@pytest.mark.parametrize("before, late", [
    # Read while pending at attempt 1, applied while pending at attempt 2: adopts attempt 1's render.
    ([(Hold(),), (Submit(),), *RETRIED[1:3]], Late(Signal(ProviderState.RUNNING))),
    # Read while attempt 1 rendered, applied while attempt 2 renders: fails attempt 2 for attempt 1's failure.
    ([(Submit(),), (Hold(),), *RETRIED[1:]], Late(Signal(ProviderState.FAILED, error=ErrorCode.TIMEOUT))),
], ids=["adopts-old-render", "fails-new-attempt"])
async def test_a_signal_judged_by_a_row_read_before_a_retry_moves_nothing(world: World, before, late):
    run = await new_run(world)
    await run_steps(run, before)
    trail = await run.trail()
    await run_steps(run, [(late,)])
    assert await run.trail() == trail, f"a signal about attempt 1 moved attempt 2: {(await run.trail())[-2:]}"


async def test_a_signal_judged_by_an_old_row_does_not_stretch_the_attempt_budget(world: World):
    run = await new_run(world)
    # Attempt 2's failure is reported twice: once current, once by a consumer that read the row earlier and
    # judges the budget by attempt 2 while the job is at its last attempt, 3. check_row fails at attempt 4.
    await run_steps(run, [
        *RETRIED, (Hold(),), *RETRIED[1:], (Late(Signal(ProviderState.FAILED, error=ErrorCode.TIMEOUT)),),
        (Recovery(),),
    ])


async def test_a_render_accepted_after_the_owner_canceled_is_asked_to_stop(world: World):
    run = await new_run(world)
    late = LateAnswers(world.submitter.adapters["fake"], "submit")
    ctx = submitter.Context(rt=world.rt, adapters={"fake": late}, policies=world.submitter.policies,
                            storage=world.submitter.storage)
    submit = asyncio.create_task(submitter.handle(ctx, JobQueued(job_id=run.job_id), Delivery(1, events.SUBMIT)))
    await late.answered.wait()  # the provider is rendering; its answer has not reached the submitter yet
    await run_steps(run, [(Cancel(),)])
    late.release.set()
    await submit
    for stop in await stop_requests(world, run.job_id):
        await poller.on_cancel(world.poller, stop, Delivery(1, events.CANCEL))
    rendering = [r.id for r in world.provider.renders.values()
                 if r.request.metadata.job_id == run.job_id and r.status is RenderStatus.RUNNING]
    assert not rendering, f"the canceled job's render {rendering} is still running (and billed) at the provider"


async def stop_requests(world: World, job_id: str) -> list[CancelRequested]:
    """Every CancelRequested published so far for the job, taken off the work stream."""
    async def published() -> bool:
        return not await world.rt.pool.fetchval("SELECT count(*) FROM outbox WHERE subject = $1", events.CANCEL)

    await wait_until(published, within=10, what="the outbox relay to publish")
    sub = await world.rt.js.pull_subscribe(events.CANCEL, durable="test-stops", stream=bus.WORK_STREAM)
    try:
        msgs = await sub.fetch(100, timeout=1)
    except TimeoutError:  # nats.errors.TimeoutError, or asyncio's own when the deadline ran out first
        msgs = []
    finally:
        await sub.unsubscribe()  # a live pull subscription would hold up the connection's drain at teardown
    found = []
    for msg in msgs:
        event = events.decode(msg.subject, msg.data)
        await msg.ack()
        if isinstance(event, CancelRequested) and event.job_id == job_id:
            found.append(event)
    return found


async def test_a_callback_that_beats_a_retried_submit_answer_is_not_dropped(world: World):
    run = await new_run(world)
    await run_steps(run, list(RETRIED[:3]))
    job = await run.job()
    assert (job.status, job.attempt) == (JobStatus.PENDING, 2)
    sig = await provider_signal(run, job, Signal(ProviderState.RUNNING))
    try:
        await poller.on_inbox(world.poller, InboxReceived(await store_callback(run, sig), "fake"),
                              Delivery(1, events.INBOX))
    except Redeliver:
        return  # kept for later: fine
    now = await run.job()
    assert now.provider_job_id == sig.provider_job_id, f"attempt 2's callback was dropped; the job is {now.status}"


async def test_a_submit_answer_that_lands_after_its_attempt_failed_leaves_the_next_attempt_alone(world: World):
    run = await new_run(world)
    late = LateAnswers(world.submitter.adapters["fake"], "submit")
    ctx = submitter.Context(rt=world.rt, adapters={"fake": late}, policies=world.submitter.policies,
                            storage=world.submitter.storage)
    submit = asyncio.create_task(submitter.handle(ctx, JobQueued(job_id=run.job_id), Delivery(1, events.SUBMIT)))
    await late.answered.wait()  # attempt 1 renders; the provider's answer is slow on its way back
    # Its callbacks beat that answer: the render is adopted, fails, and once the backoff ends attempt 2 waits.
    await run_steps(run, [(Signal(ProviderState.RUNNING),),
                          (Signal(ProviderState.FAILED, error=ErrorCode.PROVIDER_UNAVAILABLE),), (Recovery(),)])
    waiting = await run.job()
    assert (waiting.status, waiting.attempt) == (JobStatus.PENDING, 2)
    late.release.set()
    await submit
    now = await run.job()
    # Attempt 1's answer used to submit attempt 2 with attempt 1's (failed) render: nothing then rendered it,
    # every poll's answer was judged stale, and the job sat there until its deadline.
    assert (now.status, now.attempt, now.provider_job_id) == (JobStatus.PENDING, 2, None), (
        f"attempt 1's submit answer moved attempt 2: {(await run.trail())[-1]}")
