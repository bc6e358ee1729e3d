"""The history checker's promise about dead letters (7): the messages `bus` buried in the dead-letter stream
(read as `vidjobs dead list` reads them, vidjobs.common.deadletters), each with a reason the checker accepts.

A letter is accepted when it says why it was buried and its work is over: the message was about a job that
has ended (burying one fails a live job with `internal`, so its owner hears why) or was deleted, or about no
job at all (an upload's or an export's, whose own record says how it ended). A letter whose job is still
live was lost work nothing will pick up again, and one naming a job that never existed came from nowhere."""

from __future__ import annotations

import asyncpg
import nats

from tests.faults.history import Violation
from vidjobs.common import deadletters
from vidjobs.common.deadletters import DeadLetter
from vidjobs.common.states import SQL_TERMINAL


async def buried(nats_url: str) -> list[DeadLetter]:
    servers = [u.strip() for u in nats_url.split(",") if u.strip()]
    nc = await nats.connect(servers, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        return [letter async for letter in deadletters.letters(nc.jetstream(timeout=10))]
    finally:
        await nc.close()


async def letters_explained(letters: list[DeadLetter], database_url: str) -> list[Violation]:
    conn = await asyncpg.connect(database_url)
    try:
        ended = {r["id"]: r["ended"] for r in await conn.fetch(
            f"SELECT id, deleted_at IS NOT NULL OR status IN {SQL_TERMINAL} AS ended FROM jobs WHERE id = ANY($1)",
            [d.job_id for d in letters if d.job_id])}
    finally:
        await conn.close()
    out = []
    for letter in letters:
        why = _unexplained(letter, ended)
        if why:
            out.append(Violation("dead_letters_explained", letter.job_id,
                                 f"dead letter {letter.id} from {letter.consumer} ({letter.event}): {why}"))
    return out


def _unexplained(letter: DeadLetter, ended: dict[str, bool]) -> str | None:
    if not letter.error.strip():
        return "buried without a reason"
    if letter.job_id is None:
        return None
    if letter.job_id not in ended:
        return "it names a job that does not exist"
    return None if ended[letter.job_id] else "its job is still live: nothing will take the work up again"
