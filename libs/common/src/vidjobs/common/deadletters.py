"""The dead letters as a person handles them: the messages `bus` buried in the dead-letter stream after
their delivery budget, read back, and replayed to the work subject they came from.

A replay is safe because every handler rereads the row and tolerates duplicates; it publishes the original
payload under a message id of its own (so a replay interrupted and run again is dropped by JetStream's
duplicate window) and only then removes the dead letter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import msgspec
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from vidjobs.common import events
from vidjobs.common.bus import DEAD_PREFIX, DEAD_STREAM

REASON_HEADER = "Vidjobs-Dead-Reason"
SUBJECT_HEADER = "Vidjobs-Original-Subject"


class DeadLetter(msgspec.Struct, kw_only=True):
    id: int  # its sequence in the dead-letter stream
    consumer: str  # the durable consumer that gave up on it
    subject: str  # the work subject it came from, and goes back to on replay
    event: str | None  # its event tag; None when it cannot be read at all
    job_id: str | None
    error: str  # why it was buried
    at: datetime  # when it was buried
    payload: str  # the message as sent


def _letter(raw: RawStreamMsg) -> DeadLetter:
    headers = raw.headers or {}
    subject = headers.get(SUBJECT_HEADER, "")
    data = raw.data or b""
    try:
        event = events.decode(subject, data)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError):
        event = None
    assert raw.seq is not None and raw.time is not None
    return DeadLetter(
        id=raw.seq, consumer=(raw.subject or "").removeprefix(f"{DEAD_PREFIX}."), subject=subject,
        event=None if event is None else events.tag_of(event),
        job_id=getattr(event, "job_id", None), error=headers.get(REASON_HEADER, ""), at=raw.time,
        payload=data.decode(errors="replace"),
    )


async def letters(js: JetStreamContext) -> AsyncIterator[DeadLetter]:
    """Every dead letter kept, oldest first (replayed ones are gone; the stream keeps the rest 14 days)."""
    seq = 1
    while True:
        try:
            raw = await js.get_msg(DEAD_STREAM, seq=seq, subject=f"{DEAD_PREFIX}.>", next=True)
        except NotFoundError:
            return
        yield _letter(raw)
        seq = (raw.seq or seq) + 1


async def get(js: JetStreamContext, letter_id: int) -> DeadLetter | None:
    try:
        raw = await js.get_msg(DEAD_STREAM, seq=letter_id)
    except NotFoundError:
        return None
    return _letter(raw)


async def replay(js: JetStreamContext, letter_id: int) -> DeadLetter | None:
    """Publish the buried message, byte for byte, to its work subject again, then remove the dead letter.
    None if there is no such dead letter."""
    try:
        raw = await js.get_msg(DEAD_STREAM, seq=letter_id)
    except NotFoundError:
        return None
    letter = _letter(raw)
    await js.publish(letter.subject, raw.data or b"", headers={"Nats-Msg-Id": f"replay-dead-{letter.id}"},
                     timeout=5)
    await js.delete_msg(DEAD_STREAM, letter.id)
    return letter
