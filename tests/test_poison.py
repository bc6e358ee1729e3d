"""Poison messages: a message that cannot be handled goes to a dead-letter subject after a bounded number of
deliveries, and its job fails with `internal` instead of looping. The rest of the stack carries on."""

from __future__ import annotations

import asyncpg
import nats

from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import events
from vidjobs.common.bus import DEAD_STREAM

POISON_PROMPT = "a prompt this database refuses to submit"


async def _dead_letters(nats_url: str) -> list[tuple[str, dict]]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(DEAD_STREAM)
        out: list[tuple[str, dict]] = []
        if not info.state.messages:  # an empty stream's sequence 0 is no message: asking for it is a bad request
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(DEAD_STREAM, seq)
            out.append((msg.subject, dict(msg.headers or {})))
        return out
    finally:
        await nc.close()


async def test_poison_messages_are_dead_lettered_and_their_job_fails(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, max_deliveries=3)
    # Every submission of one job fails inside the database, as a bug or a corrupt row would make it fail.
    conn = await asyncpg.connect(database_url)
    await conn.execute(f"""
        CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT request->>'prompt' FROM jobs WHERE id = NEW.job_id) = '{POISON_PROMPT}' THEN
                RAISE EXCEPTION 'this submission always fails';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT ON provider_submissions
            FOR EACH ROW EXECUTE FUNCTION refuse_poison();
    """)
    await conn.close()
    async with running_stack(settings) as stack:
        nc = await nats.connect(nats_url)
        await nc.jetstream().publish(events.SUBMIT, b"{not json")  # cannot even be read
        poisoned = await stack.create_job(prompt=POISON_PROMPT, params={"render_s": 0.1})
        # A freed slot offered to the queue's head, the poisoned job: the wake-up must not become a poison
        # message of its own (the job's own message carries the failure).
        for _ in range(2):
            await nc.jetstream().publish(events.SUBMIT, events.encode(events.SlotFreed(provider="fake")))
        healthy = await stack.create_job(params={"render_s": 0.1})

        await nc.close()
        failed = await stack.wait_terminal(poisoned["id"], within=60)
        fine = await stack.wait_terminal(healthy["id"], within=60)
        dead = await wait_until(lambda: _two(nats_url), within=30, what="two dead letters")

    assert fine["status"] == "completed"
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "internal" and failed["error"]["retryable"] is True
    assert [subject for subject, _ in dead] == ["vidjobs.dead.submitter"] * 2
    reasons = sorted(headers["Vidjobs-Dead-Reason"] for _, headers in dead)
    assert reasons[0].startswith("RaiseError") and reasons[1].startswith("undecodable")


async def _two(nats_url: str) -> list | None:
    dead = await _dead_letters(nats_url)
    return dead if len(dead) == 2 else None


async def test_no_dead_letters_read_as_none(nats_url):
    """What the tests above wait on: an empty dead-letter stream is no dead letter yet, not an error that ends
    the wait (its sequence 0 is no message)."""
    from vidjobs.common import bus

    nc, js = await bus.connect(nats_url, name="dead-letter-reader")
    try:
        await bus.ensure_streams(js, replicas=1)
    finally:
        await nc.close()
    assert await _dead_letters(nats_url) == []
