"""Fixing things with one command, as an operator runs them: `vidjobs migrate --check`, `dead`, `inbox replay`,
`jobs inspect|retry|fail` and `breakers` in a subprocess, against a real database and, where a service must
act, the whole stack."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncpg
import nats
from nats.js import JetStreamContext

from tests.stack import running_stack, stack_settings
from tests.support import operator_command, wait_until
from vidjobs.cli.exitcodes import Exit
from vidjobs.common import breakers, bus
from vidjobs.common.errors import ErrorCode
from vidjobs.common.settings import Settings


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


async def test_migrate_check_names_the_gap_and_admin_commands_refuse_without_migrating(empty_database_url):
    vidjobs = operator_command(empty_database_url)
    behind, listed = await vidjobs("migrate", "--check"), await vidjobs("accounts", "list")
    assert behind.code == Exit.SCHEMA_BEHIND and "0001" in behind.err and "vidjobs migrate" in behind.err
    assert listed.code == Exit.SCHEMA_BEHIND and listed.out == "" and "vidjobs migrate" in listed.err
    conn = await asyncpg.connect(empty_database_url)
    try:
        # Neither command applied anything: the database is as empty as it was.
        assert await conn.fetchval("SELECT to_regclass('schema_migrations') IS NULL AND to_regclass('jobs') IS NULL")

        migrated = await vidjobs("migrate")
        assert migrated.code == Exit.OK, migrated.err
        current, listed = await vidjobs("migrate", "--check"), await vidjobs("accounts", "list", "--json")
        assert (current.code, listed.code) == (Exit.OK, Exit.OK), current.err + listed.err

        # A newer version migrated it since: this checkout is the older one.
        await conn.execute("INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_future.sql')")
        ahead, refused = await vidjobs("migrate", "--check"), await vidjobs("breakers", "list")
        assert ahead.code == Exit.SCHEMA_AHEAD and "9999" in ahead.err and "older than the database" in ahead.err
        assert refused.code == Exit.SCHEMA_AHEAD and refused.out == ""
    finally:
        await conn.close()


async def test_unreachable_database_and_missing_things_have_their_own_exit_codes(database_url):
    gone = await operator_command("postgresql://postgres@127.0.0.1:1/nothing")("jobs", "inspect", "job_x")
    assert gone.code == Exit.BACKEND_UNREACHABLE and "cannot reach the database" in gone.err
    vidjobs = operator_command(database_url)
    missing = await asyncio.gather(vidjobs("jobs", "inspect", "job_nope"), vidjobs("jobs", "retry", "job_nope"),
                                   vidjobs("inbox", "replay", "424242"), vidjobs("breakers", "reset", "nobody"),
                                   vidjobs("inbox", "show", "job_nope"))
    assert [m.code for m in missing] == [Exit.NOT_FOUND] * 5, [m.err for m in missing]
    usage = await vidjobs("dead", "replay")
    assert usage.code == Exit.USAGE and "--all" in usage.err


async def _admission(conn: asyncpg.Connection, job_id: str) -> breakers.Admission:
    return breakers.admission(await breakers.read(conn, "fake"), job_id, datetime.now(UTC))


async def test_breakers_listed_and_reset_as_the_submitter_sees_them(database_url, pool):
    settings = Settings(breaker_threshold=2, breaker_cooldown_s=300)
    async with pool.acquire() as conn:
        for _ in range(2):  # the submitter's own bookkeeping of two outages in a row opens the breaker
            await breakers.record_answer(conn, "fake", ErrorCode.PROVIDER_UNAVAILABLE, settings)
        assert (await _admission(conn, "job_a")).wait_s is not None
    vidjobs = operator_command(database_url)

    listed = await vidjobs("breakers", "list", "--json")
    [breaker] = _lines(listed.out)
    assert (breaker["provider"], breaker["state"], breaker["failures"]) == ("fake", "open", 2)
    assert breaker["reopen_at"] is not None

    reset = await vidjobs("breakers", "reset", "fake")
    assert reset.code == Exit.OK and "was open" in reset.err, reset.err
    async with pool.acquire() as conn:
        # Submissions flow at once, not after the five minutes' pause.
        assert await _admission(conn, "job_a") == breakers.GO
    table = await vidjobs("breakers", "list")
    assert table.out.splitlines()[1].split()[:3] == ["fake", "closed", "0"]


# Every move a provider callback makes fails inside the database, as a bug in the poller would make it fail.
_BLOCK_CALLBACKS = """
    CREATE FUNCTION refuse_callbacks() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.reason LIKE 'callback%' THEN RAISE EXCEPTION 'callbacks cannot be applied'; END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER refuse_callbacks BEFORE INSERT ON job_transitions
        FOR EACH ROW EXECUTE FUNCTION refuse_callbacks();
"""


async def test_dead_letters_are_listed_and_replayed_and_a_stored_callback_replayed(tmp_path, database_url, nats_url):
    # Recovery far away: nothing but the commands under test moves a job whose callbacks were lost.
    settings = stack_settings(tmp_path, database_url, nats_url, max_deliveries=2, recovery_delay_s=3600)
    db = await asyncpg.connect(database_url)
    await db.execute(_BLOCK_CALLBACKS)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    vidjobs = operator_command(database_url, nats_url)
    try:
        async with running_stack(settings) as stack:
            first, second = [await stack.create_job(params={"render_s": 0.1}) for _ in range(2)]

            # Each render's two callbacks (running, succeeded) were stored, and each one's message buried.
            async def all_buried():
                stored = await db.fetchval("SELECT count(*) FROM webhook_inbox")
                listed = await vidjobs("dead", "list", "--json")
                dead = _lines(listed.out)
                return dead if stored == 4 and len(dead) == 4 else None

            dead = await wait_until(all_buried, within=60, what="four buried callbacks")
            assert {(d["subject"], d["event"], d["consumer"]) for d in dead} == {
                ("vidjobs.work.inbox", "inbox.received", "poller-inbox")}
            assert all("callbacks cannot be applied" in d["error"] for d in dead)
            table = await vidjobs("dead", "list")
            assert table.out.splitlines()[0].split() == ["id", "at", "consumer", "subject", "event", "job", "error"]
            assert [(await stack.job(j["id"]))["status"] for j in (first, second)] == ["submitted", "submitted"]
            shown = await vidjobs("dead", "show", str(dead[0]["id"]))
            assert json.loads(shown.out)["payload"] == dead[0]["payload"]

            await db.execute("DROP TRIGGER refuse_callbacks ON job_transitions")
            # The second job's "succeeded" callback, straight from the inbox, through the poller.
            done_id = await db.fetchval(
                "SELECT id FROM webhook_inbox WHERE convert_from(payload, 'UTF8') LIKE '%' || $1 || '%' "
                "AND convert_from(payload, 'UTF8') LIKE '%succeeded%'", second["id"])
            replayed = await vidjobs("inbox", "replay", str(done_id))
            assert replayed.code == Exit.OK and replayed.out == "", replayed.err
            assert (await stack.wait_terminal(second["id"]))["status"] == "completed"
            trail = await stack.trail(second["id"])
            again = await vidjobs("inbox", "replay", str(done_id))
            assert again.code == Exit.OK
            await wait_until(lambda: _outbox_empty(db), what="the replayed callback to be sent")

            replay_all = await vidjobs("dead", "replay", "--all")
            assert replay_all.code == Exit.OK, replay_all.err
            assert sorted(int(n) for n in replay_all.out.split()) == sorted(d["id"] for d in dead)
            assert (await stack.wait_terminal(first["id"]))["status"] == "completed"
            assert _lines((await vidjobs("dead", "list", "--json")).out) == []
            # The second replay, and the second job's own replayed letters, were sent and handled.
            await wait_until(lambda: _callbacks_settled(db, js), what="the replayed callbacks to be handled")
            # Replayed callbacks about a job that moved on change nothing.
            assert await stack.trail(second["id"]) == trail
            gone = await vidjobs("dead", "replay", str(dead[0]["id"]))
            assert gone.code == Exit.NOT_FOUND
    finally:
        await nc.close()
        await db.close()


async def _outbox_empty(db: asyncpg.Connection) -> bool:
    return await db.fetchval("SELECT count(*) = 0 FROM outbox")


async def _callbacks_settled(db: asyncpg.Connection, js: JetStreamContext) -> bool:
    """Every callback handed to the poller was sent (the outbox holds none) and handled (its consumer has
    none waiting and none unacknowledged)."""
    if not await _outbox_empty(db):
        return False
    info = await js.consumer_info(bus.WORK_STREAM, "poller-inbox")
    return info.num_pending == 0 and info.num_ack_pending == 0


async def test_stuck_jobs_are_inspected_retried_to_completion_or_failed(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=3600)
    db = await asyncpg.connect(database_url)
    # The gateway cannot store callbacks for a while: the provider gives up on telling us. The sequence
    # counts the refusals (nextval survives the rollback), so the test sees when the provider gave up.
    await db.execute("""
        CREATE SEQUENCE inbox_refusals;
        CREATE FUNCTION refuse_inbox() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM nextval('inbox_refusals'); RAISE EXCEPTION 'inbox unavailable'; END $$;
        CREATE TRIGGER refuse_inbox BEFORE INSERT ON webhook_inbox FOR EACH ROW EXECUTE FUNCTION refuse_inbox();
    """)
    vidjobs = operator_command(database_url, nats_url)
    try:
        async with running_stack(settings) as stack:
            lost = await stack.create_job(params={"render_s": 0.1})
            hung = await stack.create_job(params={"scenario": "hang"})
            # Four tries of each callback: two of the finished render, one of the hung one's start.
            await wait_until(lambda: _refused(db, 12), within=60, what="the provider to give up its callbacks")
            await stack.wait_for_status(hung["id"], "submitted")
            await db.execute("DROP TRIGGER refuse_inbox ON webhook_inbox")
            assert (await stack.job(lost["id"]))["status"] == "submitted"  # stuck: nothing will tell us

            inspected = await vidjobs("jobs", "inspect", lost["id"], "--json")
            seen = json.loads(inspected.out)
            assert seen["job"]["status"] == "submitted" and seen["job"]["recover_at"] is not None
            assert [s["attempt"] for s in seen["provider submissions"]] == [1]
            assert [(t["from_status"], t["to_status"]) for t in seen["transitions"]] == [
                (None, "pending"), ("pending", "submitted")]
            shown = await vidjobs("jobs", "inspect", lost["id"])
            assert "transitions:" in shown.out and "provider submissions:" in shown.out

            retried = await vidjobs("jobs", "retry", lost["id"])
            assert retried.code == Exit.OK and "attempt 1" in retried.err, retried.err
            done = await stack.wait_terminal(lost["id"])
            assert done["status"] == "completed"
            moves = [(m["from"], m["to"]) for m in await stack.trail(lost["id"])]
            assert moves[:4] == [(None, "pending"), ("pending", "submitted"), ("submitted", "retrying"),
                                 ("retrying", "pending")]

            account, estimate = await db.fetchrow("SELECT account_id, estimated_credits FROM jobs WHERE id = $1",
                                                  hung["id"])
            reserved = await db.fetchval("SELECT credits_reserved FROM accounts WHERE id = $1", account)
            assert reserved == estimate > 0  # the hung job's reservation is the only one left
            failed = await vidjobs("jobs", "fail", hung["id"], "--reason", "the provider lost this render")
            assert failed.code == Exit.OK, failed.err
            ended = await stack.job(hung["id"])
            assert ended["status"] == "failed" and ended["error"]["message"] == "the provider lost this render"
            after = await db.fetchval("SELECT credits_reserved FROM accounts WHERE id = $1", account)
            assert after == 0
            released = await db.fetchval("SELECT reserved_change FROM credit_ledger WHERE job_id = $1 "
                                         "ORDER BY id DESC LIMIT 1", hung["id"])
            assert released == -estimate

            refused = await asyncio.gather(vidjobs("jobs", "retry", hung["id"]), vidjobs("jobs", "fail", lost["id"]))
            assert [r.code for r in refused] == [Exit.REFUSED] * 2 and "already ended" in refused[0].err
    finally:
        await db.close()


async def _refused(db: asyncpg.Connection, tries: int) -> bool:
    return await db.fetchval("SELECT is_called AND last_value >= $1 FROM inbox_refusals", tries)
