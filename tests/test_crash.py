"""Crash test: a hundred-odd render jobs run while every worker process, and the gateway, is killed with SIGKILL
at random moments and brought back by the supervisor. Every job must still end (or be visibly on its way to
ending), no attempt may be rendered twice, and every finished video must be whole.

The kill schedule and the job mix come from one seeded RNG; the seed is printed, and CRASH_TEST_SEED picks
another one (the interleavings themselves still depend on timing).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import random
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg
import av
import pytest

from tests.stack import Stack, running_stack, stack_settings
from vidjobs.common.states import TERMINAL

SEED = int(os.environ.get("CRASH_TEST_SEED", "20240611"))
BURSTS = 4  # jobs arrive in bursts, so every kill finds work in flight
JOBS_PER_BURST = 30
BURST_EVERY_S = 10.0
BURST_SPREAD_S = 0.5
KILLS_PER_SERVICE = {"submitter": 4, "poller": 4, "media": 4, "reaper": 4, "gateway": 3}
# The k-th kill of a service falls in this window after the k-th burst begins (seconds), when that service's
# part of the burst's work is likely under way, and after this much more once the service has work in hand.
KILL_WINDOW = {"submitter": (0.0, 1.0), "poller": (0.2, 4.0), "media": (0.5, 5.0), "reaper": (1.0, 6.0),
               "gateway": (0.1, 1.5)}
KILL_DELAY = {"submitter": (0.0, 0.0), "poller": (0.0, 0.3), "media": (0.0, 0.1), "reaper": (0.0, 0.5),
              "gateway": (0.0, 0.3)}
MIN_UP_S = 3.0  # a service is killed again only once its new process has had a moment to start working
SETTLE_WITHIN_S = 100.0  # after the last kill, how long jobs get to reach a terminal status
SCENARIOS = {"succeed": 4, "duplicate_callbacks": 3, "no_callback": 3}  # relative weights
TERMINAL_NAMES = {s.value for s in TERMINAL}

# What a service works on, as visible in the database: a kill waits (briefly) until there is some, so it
# lands on a process with work in hand rather than an idle one. For the submitter that is a claimed attempt
# the provider has not answered yet: the moment a crash must not turn into a second render.
BUSY_WITH = {
    "submitter": "SELECT 1 FROM provider_submissions WHERE provider_job_id IS NULL AND error IS NULL "
                 "AND claimed_at > now() - interval '1 second'",
    "poller": "SELECT 1 FROM jobs WHERE status IN ('pending', 'submitted', 'processing')",
    "media": "SELECT 1 FROM jobs WHERE status = 'downloading'",
    "reaper": "SELECT 1 FROM jobs WHERE recover_at <= now()",
    "gateway": "SELECT 1 FROM jobs WHERE status IN ('pending', 'submitted', 'processing')",
}
BUSY_WAIT_S = 5.0


@dataclass(frozen=True)
class Planned:
    at: float  # seconds after the start of the chaos phase
    key: str  # Idempotency-Key, so a create retried across a gateway crash makes one job
    body: dict


@dataclass
class Chaos:
    kills: Counter = field(default_factory=Counter)
    kills_with_work: Counter = field(default_factory=Counter)
    create_retries: int = 0


def plan_jobs(rng: random.Random) -> list[Planned]:
    names, weights = list(SCENARIOS), list(SCENARIOS.values())
    plan = []
    for i in range(BURSTS * JOBS_PER_BURST):
        scenario = rng.choices(names, weights)[0]
        body = {
            "prompt": f"crash test clip {i}", "duration_s": rng.choice((1, 2)),
            "aspect_ratio": rng.choice(("16:9", "9:16", "1:1")),
            # Few distinct clips, so the fake provider encodes each once and its CPU stays out of the way.
            "seed": rng.randrange(4),
            "params": {"scenario": scenario, "render_s": round(rng.uniform(0, 1), 2)},
        }
        at = (i // JOBS_PER_BURST) * BURST_EVERY_S + rng.uniform(0, BURST_SPREAD_S)
        plan.append(Planned(at=at, key=f"crash-{SEED}-{i}", body=body))
    return sorted(plan, key=lambda p: p.at)


def plan_kills(rng: random.Random) -> list[tuple[float, float, str]]:
    """(moment, extra delay once the service has work, service), the k-th kill of each after the k-th burst."""
    schedule = [((k % BURSTS) * BURST_EVERY_S + rng.uniform(*KILL_WINDOW[name]), rng.uniform(*KILL_DELAY[name]), name)
                for name, n in KILLS_PER_SERVICE.items() for k in range(n)]
    return sorted(schedule)


async def create_job(stack: Stack, planned: Planned, chaos: Chaos) -> str:
    """Create one job, retrying through a dead gateway; the Idempotency-Key makes a retry return the same job."""
    payload = {"model": "fake/default", **planned.body}
    headers = {**stack.auth, "Idempotency-Key": planned.key}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        try:
            async with stack.session.post(f"{stack.url}/v1/jobs", json=payload, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=10)) as resp:
                data = await resp.json(content_type=None)
                if resp.status in (200, 201):
                    return data["id"]
                assert resp.status >= 500, f"create refused with {resp.status}: {data}"
                last = f"{resp.status}: {data}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = repr(exc)
        chaos.create_retries += 1
        assert loop.time() < deadline, f"job {planned.key} could not be created within 60s; last: {last}"
        await asyncio.sleep(0.3)


async def create_all(stack: Stack, plan: list[Planned], t0: float, chaos: Chaos) -> list[str]:
    async def at_its_time(p: Planned) -> str:
        await asyncio.sleep(max(0.0, t0 + p.at - time.monotonic()))
        return await create_job(stack, p, chaos)

    return list(await asyncio.gather(*(at_its_time(p) for p in plan)))


async def in_flight(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT status::text AS s, count(*) AS n FROM jobs WHERE status NOT IN "
                            "('completed', 'failed', 'canceled', 'expired') GROUP BY status")
    return {r["s"]: r["n"] for r in rows}


async def kill_one(stack: Stack, pool: asyncpg.Pool, name: str, delay: float, t0: float, chaos: Chaos) -> None:
    supervisor = stack.supervisor
    child = supervisor.children[name]
    loop = asyncio.get_running_loop()
    # Kill a running process, not the gap between two: wait for a pending restart, and for work to be there.
    deadline = loop.time() + 20
    while loop.time() < deadline:
        if supervisor.pid(name) is not None and time.monotonic() - child.started_at >= MIN_UP_S:
            break
        await asyncio.sleep(0.1)
    deadline = loop.time() + BUSY_WAIT_S
    busy = False
    while not busy and loop.time() < deadline:
        busy = await pool.fetchval(f"SELECT EXISTS ({BUSY_WITH[name]})")
        if not busy:
            await asyncio.sleep(0.005)
    await asyncio.sleep(delay)
    pid = supervisor.pid(name)
    if pid is None:
        return
    await supervisor.stop(name, sig=signal.SIGKILL, restart=True)
    flight = await in_flight(pool)
    chaos.kills[name] += 1
    chaos.kills_with_work[name] += busy
    print(f"  t={time.monotonic() - t0:5.1f}s  SIGKILL {name:9} (pid {pid}); then in flight {flight}", flush=True)


async def kill_all(stack: Stack, schedule: list[tuple[float, float, str]], t0: float, chaos: Chaos) -> None:
    """Each service's kills in order, services independently of one another (so some die together)."""
    async with asyncpg.create_pool(stack.settings.database_url, min_size=1, max_size=3) as pool:
        async def one_service(name: str) -> None:
            for at, delay, _ in [s for s in schedule if s[2] == name]:
                await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
                await kill_one(stack, pool, name, delay, t0, chaos)

        await asyncio.gather(*(one_service(name) for name in KILLS_PER_SERVICE))


async def wait_everything_back(stack: Stack) -> None:
    supervisor = stack.supervisor
    for _ in range(300):
        if all(supervisor.pid(n) is not None for n in supervisor.children):
            break
        await asyncio.sleep(0.1)
    missing = [n for n in supervisor.children if supervisor.pid(n) is None]
    assert not missing, f"the supervisor did not bring back {missing}"
    for _ in range(300):
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with stack.session.get(f"{stack.url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise AssertionError("the gateway did not become ready again after the kills")


async def job_rows(conn: asyncpg.Connection, ids: list[str]) -> dict[str, asyncpg.Record]:
    rows = await conn.fetch(
        "SELECT id, status::text AS status, attempt, recover_at, deleted_at, error FROM jobs WHERE id = ANY($1)", ids)
    return {r["id"]: r for r in rows}


async def wait_settled(conn: asyncpg.Connection, ids: list[str], t0: float) -> dict[str, asyncpg.Record]:
    """Rows of every job, once all are terminal or the bounded wait is over; progress printed as it goes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_WITHIN_S
    last_print = 0.0
    while True:
        rows = await job_rows(conn, ids)
        live = [r for r in rows.values() if r["status"] not in TERMINAL_NAMES]
        if time.monotonic() - last_print >= 5 or not live:
            by_status = Counter(r["status"] for r in rows.values())
            print(f"  t={time.monotonic() - t0:5.1f}s  {dict(sorted(by_status.items()))}", flush=True)
            last_print = time.monotonic()
        if not live or loop.time() > deadline:
            return rows
        await asyncio.sleep(0.5)


def assert_still_progressing(rows: dict[str, asyncpg.Record], interval_s: float) -> None:
    """A job not terminal when the wait ends must at least be scheduled to be looked at again soon."""
    now = datetime.now(UTC)
    stuck = []
    for r in rows.values():
        if r["status"] in TERMINAL_NAMES:
            continue
        due = r["recover_at"]
        soon = due is not None and now - timedelta(seconds=30) <= due <= now + timedelta(seconds=interval_s + 30)
        print(f"  not terminal: {r['id']} {r['status']} attempt {r['attempt']} recover_at {due}", flush=True)
        if not soon:
            stuck.append((r["id"], r["status"], due))
    assert not stuck, f"jobs neither terminal nor due for recovery: {stuck}"


def reason_kind(reason: str) -> str:
    """An audit reason without its ids and times, so reasons can be counted."""
    return re.sub(r"(job|rnd)_[0-9a-z]+|retry at \S+", "…", reason)


async def account(stack: Stack) -> dict:
    async with stack.session.get(f"{stack.url}/v1/account", headers=stack.auth) as resp:
        assert resp.status == 200
        return await resp.json()


async def all_renders(stack: Stack) -> list[dict]:
    async with stack.session.get(f"{stack.settings.fake_provider_url}/v1/renders") as resp:
        assert resp.status == 200
        return (await resp.json())["data"]


async def assert_video_intact(stack: Stack, job_id: str) -> None:
    job = await stack.job(job_id)
    out = job["outputs"]
    assert out is not None, job
    status, body, _ = await stack.download(out["video_url"])
    assert status == 200, f"{job_id}: video answered {status}"
    assert len(body) == out["bytes"], f"{job_id}: {len(body)} bytes, recorded {out['bytes']}"
    assert hashlib.sha256(body).hexdigest() == out["sha256"], f"{job_id}: sha256 differs from the recorded one"
    assert body[4:8] == b"ftyp", f"{job_id}: not an MP4 container"
    with av.open(io.BytesIO(body)) as container:
        frame = next(container.decode(video=0))
        assert (frame.width, frame.height) == (out["width"], out["height"]), job_id


# The default run's nemesis (tests/test_nemesis.py) kills every service at random among its other faults, and
# checks the whole history; this older, kill-only run is kept for `pytest -m long`.
@pytest.mark.long
@pytest.mark.timeout(1800)
async def test_jobs_survive_every_process_being_killed_at_random(tmp_path, database_url, nats_url):
    print(f"\ncrash test seed {SEED} (CRASH_TEST_SEED={SEED} to reproduce)", flush=True)
    rng = random.Random(SEED)
    plan = plan_jobs(rng)
    schedule = plan_kills(rng)
    settings = stack_settings(
        tmp_path, database_url, nats_url, recovery_delay_s=3, recovery_interval_s=3, ack_wait_s=5,
        provider_timeout_s=5, max_deliveries=25, render_deadline_s=120,
    )
    chaos = Chaos()
    started = time.monotonic()
    async with running_stack(settings) as stack:
        credits_before = (await account(stack))["credits"]
        t0 = time.monotonic()
        creating = asyncio.create_task(create_all(stack, plan, t0, chaos))
        await kill_all(stack, schedule, t0, chaos)
        ids = await creating
        assert len(set(ids)) == len(plan), "a retried create made a second job, or two creates one"
        await wait_everything_back(stack)

        conn = await asyncpg.connect(database_url)
        try:
            rows = await wait_settled(conn, ids, t0)
            trails: dict[str, list[asyncpg.Record]] = {}
            for t in await conn.fetch("SELECT job_id, to_status::text AS to_status, at, reason FROM job_transitions "
                                      "WHERE job_id = ANY($1) ORDER BY id", ids):
                trails.setdefault(t["job_id"], []).append(t)
            jobs_made = await conn.fetchval("SELECT count(*) FROM jobs")
            charged = await conn.fetchval("SELECT COALESCE(sum(actual_credits), 0) FROM jobs WHERE id = ANY($1)", ids)
            submissions = await conn.fetch(
                "SELECT job_id, attempt, provider_job_id, extract(epoch FROM answered_at - created_at) AS took_s "
                "FROM provider_submissions WHERE job_id = ANY($1)", ids)
        finally:
            await conn.close()
        counters = await stack.counters()
        renders = await all_renders(stack)

        credits_after = (await account(stack))["credits"]
        reasons = Counter(reason_kind(t["reason"]) for trail in trails.values() for t in trail)
        by_status = Counter(r["status"] for r in rows.values())
        renders_by_job = counters["renders_by_job"]
        attempts = Counter(r["attempt"] for r in rows.values())
        print(f"seed {SEED}: {len(ids)} jobs; kills {dict(chaos.kills)}, of which with work in hand "
              f"{dict(chaos.kills_with_work)}; create retries {chaos.create_retries}", flush=True)
        print(f"moves by reason: {dict(reasons.most_common())}", flush=True)
        slow = sorted(round(s["took_s"], 1) for s in submissions if s["took_s"] is not None and s["took_s"] > 5)
        unanswered = sum(s["took_s"] is None for s in submissions)
        print(f"attempts a submitter died calling: {len(slow)} answered late (after {slow} s), {unanswered} "
              f"adopted from a callback without the submit answer", flush=True)
        print(f"final status {dict(by_status)}; attempts {dict(sorted(attempts.items()))}; "
              f"renders {sum(renders_by_job.get(i, 0) for i in ids)}; max attempt {max(attempts)}; "
              f"provider submits {sum(counters['submissions_by_job'].get(i, 0) for i in ids)}; "
              f"output fetches {sum(counters['output_fetches'].values())}; "
              f"elapsed {time.monotonic() - started:.1f}s", flush=True)

        for job_id, r in rows.items():
            if r["status"] not in TERMINAL_NAMES:
                moves = [(t["at"].time().isoformat(), t["to_status"], t["reason"]) for t in trails[job_id]]
                print(f"  trail of {job_id}: {moves}", flush=True)

        assert all(chaos.kills[name] >= 2 for name in KILLS_PER_SERVICE), f"too few kills landed: {dict(chaos.kills)}"
        assert jobs_made == len(plan), f"{jobs_made} jobs in the database for {len(plan)} creates"
        assert_still_progressing(rows, settings.recovery_interval_s)
        failed = {i: (r["status"], r["error"]) for i, r in rows.items()
                  if r["status"] in TERMINAL_NAMES and r["status"] != "completed"}
        assert not failed, f"healthy renders ended other than completed: {failed}"

        # One provider render per attempt: the provider saw each attempt's key at most once as a new render,
        # never rendered a job more times than it had attempts, and rendered every attempt that went through.
        mine = [r for r in renders if r["metadata"]["job_id"] in rows]
        per_attempt = Counter((r["metadata"]["job_id"], r["metadata"]["attempt"]) for r in mine)
        twice = {k: n for k, n in per_attempt.items() if n > 1}
        assert not twice, f"attempts rendered more than once: {twice}"
        over = {i: (renders_by_job.get(i, 0), r["attempt"]) for i, r in rows.items()
                if renders_by_job.get(i, 0) > r["attempt"]}
        assert not over, f"jobs rendered more often than they had attempts (renders, attempts): {over}"
        short = {i: (renders_by_job.get(i, 0), r["attempt"]) for i, r in rows.items()
                 if r["status"] == "completed" and renders_by_job.get(i, 0) != r["attempt"]}
        assert not short, f"completed jobs whose renders differ from their attempts (renders, attempts): {short}"
        accepted = {(s["job_id"], s["attempt"]): s["provider_job_id"] for s in submissions}
        for r in mine:
            recorded = accepted.get((r["metadata"]["job_id"], r["metadata"]["attempt"]))
            assert recorded in (None, r["id"]), f"submission row names {recorded}, the provider rendered {r['id']}"

        # Within one attempt a status is entered once, however often its signal or message came.
        repeated = {i: [t["to_status"] for t in trails[i]] for i, r in rows.items() if r["attempt"] == 1
                    and len({t["to_status"] for t in trails[i]}) != len(trails[i])}
        assert not repeated, f"a status entered twice in one attempt: {repeated}"
        if by_status["completed"] == len(rows):
            assert credits_after["reserved"] == credits_before["reserved"], (credits_before, credits_after)
            assert credits_after["balance"] == credits_before["balance"] - charged, (credits_before, credits_after)

        completed = [i for i, r in rows.items() if r["status"] == "completed"]
        for job_id in completed:
            await assert_video_intact(stack, job_id)
        print(f"{len(completed)} videos downloaded and verified; total {time.monotonic() - started:.1f}s", flush=True)
