"""What providers told the poller, kept beside the inbox (vidjobs.poller.records): status polls' answers (a run
of the same answer in one row that counts them), refused polls, and which job each stored callback was about,
or that it was about none; bounded in size, in rows per job and in time; shown by `vidjobs inbox show` and
`vidjobs inbox unmatched`."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import msgspec

from tests.stack import running_stack, stack_settings
from tests.support import operator_command, wait_until
from vidjobs.cli.exitcodes import Exit
from vidjobs.common import creation, outbox
from vidjobs.common.errors import ErrorCode, JobError, ProviderError
from vidjobs.common.events import InboxReceived
from vidjobs.common.jobs import JobRequest, JobRow
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.poller import records
from vidjobs.providers.base import ProviderSignal, ProviderState

ACCOUNT = "acct_answers"


async def _polled_job(pool: asyncpg.Pool, render_id: str = "rnd_p") -> JobRow:
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ($1, $1, 1000) ON CONFLICT DO NOTHING",
                       ACCOUNT)
    async with pool.acquire() as conn:
        async with conn.transaction():
            job = await creation.create(conn, account_id=ACCOUNT, request=JobRequest(model="fake-poll/x", prompt="p"),
                                        estimated_credits=1, recovery_delay_s=60)
        moved = await transition(conn, job.id, JobStatus.SUBMITTED, reason="test",
                                 update=JobUpdate(provider_job_id=render_id))
    assert moved is not None
    return moved.job


def _said(state: ProviderState, progress: float | None = None, **more: object) -> ProviderSignal:
    return msgspec.convert({"provider_job_id": "rnd_p", "state": state.value, "progress": progress, **more},
                           ProviderSignal)


async def _rows(pool: asyncpg.Pool, job_id: str) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT kind, state, answers, signal, first_at, last_at FROM provider_answers "
                            "WHERE job_id = $1 ORDER BY id", job_id)


async def test_a_run_of_the_same_poll_answer_is_one_row_that_counts_it(pool):
    job = await _polled_job(pool)
    for progress in (0.1, 0.5, 0.9):
        await records.poll_answered(pool, job, _said(ProviderState.RUNNING, progress), keep=20)
    await records.poll_answered(pool, job, _said(ProviderState.SUCCEEDED, 1.0, output_url="http://x/r.mp4"), keep=20)
    await records.poll_refused(pool, job, ProviderError(ErrorCode.INVALID_INPUT, "no such render"), keep=20)
    rows = await _rows(pool, job.id)

    assert [(r["kind"], r["state"], r["answers"]) for r in rows] == [
        ("poll", "running", 3), ("poll", "succeeded", 1), ("poll", "refused", 1)]
    running = rows[0]["signal"]
    assert running["progress"] == 0.9 and rows[0]["last_at"] > rows[0]["first_at"]  # the latest, and when
    assert rows[2]["signal"]["error"]["code"] == "invalid_input"


async def test_what_a_provider_controls_is_bounded_in_size_and_in_rows_per_job(pool):
    job = await _polled_job(pool)
    flood = "x" * 1_000_000
    huge = _said(ProviderState.FAILED, output_url=flood, error=JobError.of(ErrorCode.INTERNAL, flood))
    await records.poll_answered(pool, job, huge, keep=5)
    kept = await pool.fetchval("SELECT octet_length(signal::text) FROM provider_answers WHERE job_id = $1", job.id)
    for i in range(30):  # answers that change every time: each is a row of its own
        state = ProviderState.QUEUED if i % 2 else ProviderState.RUNNING
        await records.poll_answered(pool, job, _said(state, queue_position=i), keep=5)
    rows = await _rows(pool, job.id)

    assert kept < 3 * records.TEXT_CHARS
    assert len(rows) == 5 and [r["state"] for r in rows] == ["queued", "running", "queued", "running", "queued"]


async def test_answers_go_with_the_inbox_retention(pool):
    old, new = await _polled_job(pool, "rnd_old"), await _polled_job(pool, "rnd_new")
    for job in (old, new):
        await records.poll_answered(pool, job, _said(ProviderState.RUNNING), keep=20)
    await pool.execute("UPDATE provider_answers SET first_at = now() - interval '8 days', "
                       "last_at = now() - interval '8 days' WHERE job_id = $1", old.id)

    removed = await records.prune(pool, retention_days=7)

    assert removed == 1 and await _rows(pool, old.id) == [] and len(await _rows(pool, new.id)) == 1


async def test_an_answer_that_cannot_be_kept_is_logged_and_holds_nothing_up(pool, caplog):
    job = await _polled_job(pool)
    await pool.execute("ALTER TABLE provider_answers RENAME TO provider_answers_gone")  # a write that must fail

    await records.poll_answered(pool, job, _said(ProviderState.RUNNING), keep=20)
    await records.callback_handled(pool, 1, "fake", _said(ProviderState.RUNNING), None, keep=20)

    assert caplog.text.count("provider answer not kept") == 2


async def _stored_callback(database_url: str, render_id: str) -> int:
    """A verified callback about `render_id` as the gateway stores it, received a minute ago (so the poller
    does not wait for a submit to record it), with the message that hands it to the poller."""
    sig = ProviderSignal(provider_job_id=render_id, state=ProviderState.RUNNING)
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            inbox_id: int = await conn.fetchval(
                "INSERT INTO webhook_inbox (provider, webhook_id, payload, signal, received_at) "
                "VALUES ('fake', $1, '{}', $2::text::jsonb, now() - interval '1 minute') RETURNING id",
                f"msg_{render_id}", msgspec.json.encode(sig).decode())
            await outbox.add(conn, [InboxReceived(inbox_id=inbox_id, provider="fake")])
    finally:
        await conn.close()
    return inbox_id


async def _kept(database_url: str, inbox_id: int) -> bool:
    conn = await asyncpg.connect(database_url)
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM provider_answers WHERE inbox_id = $1", inbox_id))
    finally:
        await conn.close()


async def test_the_inbox_commands_answer_what_the_provider_told_us_polled_or_called_back(tmp_path, database_url,
                                                                                       nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=600)
    vidjobs = operator_command(database_url)
    async with running_stack(settings) as stack:
        polled = await stack.create_job(model="fake-poll/default", params={"render_s": 1.5})
        called = await stack.create_job(params={"render_s": 0.2})
        unknown = await _stored_callback(database_url, "rnd_nobody_knows")
        for job in (polled, called):
            assert (await stack.wait_terminal(job["id"], within=60))["status"] == "completed"
        await wait_until(lambda: _kept(database_url, unknown), within=30, what="the unknown render's callback kept")
        polls, calls, strays, table = await asyncio.gather(
            vidjobs("inbox", "show", polled["id"], "--json"), vidjobs("inbox", "show", called["id"], "--json"),
            vidjobs("inbox", "unmatched", "--json"), vidjobs("inbox", "show", polled["id"]))

    answers = [json.loads(line) for line in polls.out.splitlines()]
    assert polls.code == Exit.OK and answers and {a["kind"] for a in answers} == {"poll"}, polls.err
    states = [a["state"] for a in answers]
    assert states[-1] == "succeeded" and all(a != b for a, b in zip(states, states[1:], strict=False)), states
    callbacks = [json.loads(line) for line in calls.out.splitlines()]
    assert callbacks and {(c["kind"], c["job_id"]) for c in callbacks} == {("callback", called["id"])}
    assert all(c["inbox_id"] is not None and c["webhook_id"] for c in callbacks)
    [stray] = [json.loads(line) for line in strays.out.splitlines()]
    assert (stray["inbox_id"], stray["job_id"], stray["provider_job_id"]) == (unknown, None, "rnd_nobody_knows")
    assert table.out.splitlines()[0].split()[:4] == ["at", "last", "kind", "n"] and "succeeded" in table.out
