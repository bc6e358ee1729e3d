"""The stage people see only moves forward (docs/ARCHITECTURE.md "Job states"): on every legal path of statuses;
in the transition function's own SQL, its trail and the webhooks it tells apps of, from every stage a job can
have reached; and through the whole stack for a retried job, seen in its event stream and its trail, with the
attempt it is on and why it went round again."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from tests.gateway_harness import read_event
from tests.stack import running_stack, stack_settings
from vidjobs.common import creation, events, transitions
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.jobs import JobRequest
from vidjobs.common.states import (
    LEGAL,
    STAGE_OF,
    STAGE_ORDER,
    TERMINAL,
    FollowUp,
    JobStatus,
    Stage,
    app_events,
    stage_after,
)

S = JobStatus
MOVES = 13  # long enough for two retries of a render, then the way to expiry


def legal_paths(moves: int) -> Iterator[list[JobStatus]]:
    """Every legal sequence of statuses from creation (pending), of up to `moves` moves."""
    stack = [[S.PENDING]]
    while stack:
        path = stack.pop()
        yield path
        if len(path) <= moves:
            stack.extend([*path, to] for to in LEGAL[path[-1]])


def shown(path: list[JobStatus]) -> list[Stage]:
    """The stage a job shows after each status of `path`."""
    out: list[Stage] = []
    for status in path:
        out.append(stage_after(out[-1] if out else None, status))
    return out


def test_on_every_legal_path_the_stage_never_goes_back():
    walked = retried = 0
    for path in legal_paths(MOVES):
        stages = shown(path)
        walked += 1
        assert all(STAGE_ORDER[a] <= STAGE_ORDER[b] for a, b in zip(stages, stages[1:], strict=False)), (
            list(zip(path, stages, strict=True)))
        # An ending shows itself; before one, a job never shows less than its status's own stage.
        assert all(stage is STAGE_OF[s] if s in TERMINAL else STAGE_ORDER[stage] >= STAGE_ORDER[STAGE_OF[s]]
                   for s, stage in zip(path, stages, strict=True))
        if S.RETRYING not in path:
            assert stages == [STAGE_OF[s] for s in path]  # never retried: each status's own stage, as ever
        else:
            retried += 1
        # `job.stage` is told exactly when the stage shown changes.
        for (src, to), (before, after) in zip(zip(path, path[1:], strict=False),
                                              zip(stages, stages[1:], strict=False), strict=True):
            told = app_events(src, to, stage_moved=before is not after)
            assert ("job.stage" in told) is (before is not after)
            assert ("job.retrying" in told) is (to is S.RETRYING)
    assert walked > 30_000 and retried > 20_000, (walked, retried)


def reachable() -> set[tuple[Stage, JobStatus]]:
    """Every (stage reached, status) a job can be in: what the stage after a move depends on."""
    seen: set[tuple[Stage, JobStatus]] = set()
    todo = [(Stage.QUEUED, S.PENDING)]
    while todo:
        here = todo.pop()
        if here in seen:
            continue
        seen.add(here)
        todo.extend((stage_after(here[0], to), to) for to in LEGAL[here[1]])
    return seen


async def test_the_transition_stores_the_stage_tells_it_and_keeps_the_retry_as_the_walk_says(pool):
    """From every stage a job can have reached, each legal move through the real transition function stores,
    trails and tells of the stage `stage_after` makes."""
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_s', 'acct_s', 100000)")
    busy = JobError.of(ErrorCode.PROVIDER_UNAVAILABLE, "The provider was busy.")
    states = sorted(reachable())
    assert (Stage.RENDERING, S.PENDING) in states and (Stage.SUBMITTED, S.RETRYING) in states
    for reached, status in states:
        for to in sorted(LEGAL[status]):
            async with pool.acquire() as conn, conn.transaction():
                job = await creation.create(conn, account_id="acct_s", request=JobRequest(model="fake/default",
                                                                                           prompt="a fox"),
                                            estimated_credits=1, recovery_delay_s=60, webhook_url="https://app.test/h")
                # The job as a path to (reached, status) would have left it.
                await conn.execute("UPDATE jobs SET status = $2::job_status, stage = $3, recover_at = CASE WHEN "
                                   "$2::job_status = ANY($4::job_status[]) THEN NULL ELSE recover_at END WHERE id = $1",
                                   job.id, status.value, reached.value, [s.value for s in TERMINAL])
                await conn.execute("DELETE FROM outbox")
                error = busy if to in (S.RETRYING, S.FAILED) else transitions.UNSET
                moved = await transitions.transition(conn, job.id, to, reason="walk",
                                                     update=transitions.JobUpdate(error=error))
                assert moved is not None, (reached, status, to)
                after = stage_after(reached, to)
                trailed = await conn.fetchval("SELECT stage FROM job_transitions WHERE job_id = $1 AND reason = 'walk'",
                                              job.id)
                assert (moved.job.stage, Stage(trailed)) == (after, after), (reached, status, to)
                told = [events.decode(r["subject"], r["payload"]) for r in await conn.fetch(
                    "SELECT subject, payload FROM outbox WHERE subject = $1", events.APP_EVENTS)]
                expected = app_events(status, to, stage_moved=after is not stage_after(reached, status))
                assert [msgspec.to_builtins(e)["types"] for e in told] == ([expected] if expected else []), (
                    reached, status, to)
                if to is S.RETRYING:
                    assert moved.job.retry_error == busy
                assert FollowUp.TELL_APPS in transitions.FOLLOW_UPS[status, to] or not expected


# The order the stages come in; the three endings are last, expiry after being ready.
ORDER = {"queued": 0, "submitted": 1, "rendering": 2, "downloading": 3, "ready": 4, "failed": 4, "canceled": 4,
         "expired": 5}


def _never_back(stages: list[str]) -> bool:
    return all(ORDER[a] <= ORDER[b] for a, b in zip(stages, stages[1:], strict=False))


async def test_a_retried_job_keeps_its_stage_and_says_which_attempt_and_why(tmp_path, database_url, nats_url):
    """Its first render fails after it started (a transient error), so it waits out a backoff, queues again
    and renders on its second attempt: it stays at the stage it reached all along, and says which attempt it
    is on and what sent it round again."""
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=1,
                              retry_base_s=0.2, retry_cap_s=0.5, max_attempts=3,
                              retry_policies={"fake": {"max_elapsed_s": 300}})
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"scenario": "fail_then_succeed", "failures": 1, "render_s": 0.3})
        seen = []
        async with stack.session.get(f"{stack.url}/v1/jobs/{job['id']}/stream", headers=stack.auth) as resp:
            while (event := await read_event(resp)) is not None:
                seen.append(event[1])
        trail = await stack.trail(job["id"])

    done = seen[-1]
    assert done["status"] == "completed" and done["attempt"] == 2, done
    # What ended the first attempt, kept once the job went on: "attempt 2 of 3: <why>".
    assert done["retry"]["code"] == "provider_unavailable" and done["retry"]["max_attempts"] == 3, done
    assert "GPU memory" in done["retry"]["message"]
    moves = [(m["from"], m["to"]) for m in trail]
    back = moves.index(("retrying", "pending"))
    assert moves[back - 1][1] == "retrying" and moves[back - 1][0] in ("submitted", "processing"), moves
    # The trail says the stage after each move; the retry left it where the first attempt had got to.
    stages = [m["stage"] for m in trail]
    assert _never_back(stages), list(zip(moves, stages, strict=True))
    assert stages[back - 1] == stages[back] != "queued", list(zip(moves, stages, strict=True))
    assert stages[-1] == "ready"
    # What the stream showed never went back either, and the second attempt was shown as one.
    assert _never_back([e["stage"] for e in seen]), [(e["status"], e["stage"]) for e in seen]
    assert any(e["attempt"] == 2 and e["retry"] is not None and e["status"] != "completed" for e in seen), seen
