"""Estimated start and ready times of waiting jobs (vidjobs.common.estimates): the arithmetic on its own (jobs
ahead across accounts, slots coming free, rounding); the words when there is no estimate; an open stream
learning of a moved estimate from the reads the process shares; and, through the whole stack, estimates
that the queued jobs' real start and ready times then fall within."""

from __future__ import annotations

import asyncio
import heapq
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import asyncpg
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway_harness import auth, gateway_settings, read_event, running_gateway
from tests.stack import demo_key, running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import metrics, switch
from vidjobs.common.estimates import (
    AccountLoad,
    Backlog,
    Inputs,
    Measured,
    ProviderQueue,
    estimate,
    moved,
    slot_free_at,
    slot_free_in,
)
from vidjobs.common.settings import ProviderLimits, Settings

NOON = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
ONE_SLOT = {"fake": ProviderLimits(concurrency=1, rate_per_s=1000, burst=1000)}


# ---- the arithmetic ----------------------------------------------------------------------------------------

def test_jobs_ahead_across_accounts_follow_the_round_robin():
    backlog = Backlog({"a": 3, "b": 1, "c": 5})

    # a's first job: none of its own ahead; at worst each other account's first goes before it.
    assert backlog.ahead("a", 1) == (0, 2)
    # a's second: its first, and each other account's first (b has only one) to their second.
    assert backlog.ahead("a", 2) == (1 + 1 + 1, 1 + 1 + 2)
    # a's third: two of its own, b's one, c's two to three.
    assert backlog.ahead("a", 3) == (2 + 1 + 2, 2 + 1 + 3)
    # c's fifth, behind everyone else's whole queue.
    assert backlog.ahead("c", 5) == (4 + 3 + 1, 4 + 3 + 1)
    # An account with nothing waiting there yet (a job that would join): only the others count.
    assert Backlog({"b": 4}).ahead("new", 1) == (0, 1)


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 40), min_size=1), st.data())
def test_jobs_ahead_is_the_sum_over_accounts_however_it_is_kept(waiting, data):
    account = data.draw(st.sampled_from(sorted(waiting)))
    place = data.draw(st.integers(1, waiting[account]))
    others = [n for a, n in waiting.items() if a != account]

    expected = (place - 1 + sum(min(n, place - 1) for n in others), place - 1 + sum(min(n, place) for n in others))
    assert Backlog(waiting).ahead(account, place) == expected


def _simulated_free(remaining: list[float], slots: int, nth: int, hold_s: float) -> float:
    """The same question answered one event at a time: renders in flight finish, then each start holds a slot."""
    ends = sorted(remaining)
    # Only when fewer than `slots` are in flight may one start.
    heap = ends[:]
    heapq.heapify(heap)
    starts: list[float] = []
    clock = 0.0
    while len(starts) <= nth:
        while len(heap) >= slots:
            clock = max(clock, heapq.heappop(heap))
        starts.append(clock)
        heapq.heappush(heap, clock + hold_s)
    return starts[nth]


@given(st.lists(st.floats(0, 10), max_size=6), st.integers(1, 4), st.integers(0, 12), st.floats(0.5, 10))
def test_slots_come_free_as_renders_in_flight_end_and_then_turn_over(remaining, slots, nth, hold_s):
    remaining = [min(r, hold_s) for r in remaining]  # a render in flight has at most one hold left

    assert slot_free_in(remaining, slots, nth, hold_s) == pytest.approx(_simulated_free(remaining, slots, nth, hold_s))


@given(st.lists(st.floats(0, 30), max_size=8), st.integers(1, 4), st.integers(0, 12), st.floats(0.5, 10))
def test_the_slot_read_from_one_render_is_the_slot_made_from_all_of_them(ages, slots, nth, hold_s):
    """What an estimate computes (slot_free_at: renders in flight oldest first, one of them read) against the
    reference (slot_free_in over every render's time left, sorted): the same answer, however many are in
    flight, including renders past their hold and more in flight than slots."""
    started = tuple(sorted(NOON - timedelta(seconds=age) for age in ages))
    remaining = [max(0.0, hold_s - age) for age in ages]

    # A start time holds whole microseconds: the two may differ by that rounding, no more.
    assert slot_free_at(started, slots, nth, hold_s, NOON) == \
        pytest.approx(slot_free_in(remaining, slots, nth, hold_s), abs=2e-6)


def test_a_queue_keeps_its_renders_oldest_first_however_they_were_read():
    late, early = NOON, NOON - timedelta(seconds=5)

    assert ProviderQueue(backlog=Backlog({}), accounts={}, rendering=(late, early)).rendering == (early, late)
    assert AccountLoad(cap=1, rendering=(late, early)).rendering == (early, late)


def _inputs(**changes) -> Inputs:
    base = {
        "model": "fake/default", "place": 1, "account_id": "a", "account": AccountLoad(cap=10, rendering=()),
        "queue": ProviderQueue(backlog=Backlog({"a": 1}), accounts={}, rendering=()),
        "measured": Measured(samples=20, hold_p50_s=10, hold_p90_s=20, ready_p50_s=12, ready_p90_s=25),
        "limits": ProviderLimits(concurrency=1, rate_per_s=100), "settings": Settings(estimate_min_samples=5),
        "now": NOON,
    }
    return Inputs(**{**base, **changes})


def test_start_and_ready_times_from_the_slots_the_hold_and_the_queue():
    # Third of its account's jobs at a provider with one slot, whose render in flight began 4.5 s ago.
    made = estimate(_inputs(place=3, queue=ProviderQueue(backlog=Backlog({"a": 3}), accounts={},
                                                         rendering=(NOON - timedelta(seconds=4.5),))))

    # p50: 5.5 s left of the render in flight, then two holds of 10 s; p90: 15.5 s left, then two of 20 s.
    assert (made.jobs_ahead, made.jobs_ahead_p90) == (2, 2)
    assert made.start_p50 == NOON + timedelta(seconds=25)  # 25.5 s, rounded down to the second
    assert made.start_p90 == NOON + timedelta(seconds=56)  # 55.5 s, rounded up
    assert made.ready_p50 == NOON + timedelta(seconds=37)  # 25.5 + 12
    assert made.ready_p90 == NOON + timedelta(seconds=85)  # 55.5 + 25 = 80.5: past a minute, rounded up to 5 s
    assert made.unavailable is None and "20 renders of fake/default" in made.note


def test_the_accounts_cap_or_the_rate_cap_holds_a_job_back_when_it_binds():
    # Four slots free at the provider, but the account renders one at a time and has one in flight.
    capped = estimate(_inputs(place=2, account=AccountLoad(cap=1, rendering=(NOON,)),
                              limits=ProviderLimits(concurrency=4, rate_per_s=100)))
    assert capped.start_p50 == NOON + timedelta(seconds=20)  # its render in flight (10 s), then its first (10 s)
    assert "your account's limit of 1" in capped.note

    # One submission a minute: the jobs ahead go through no faster than that.
    paced = estimate(_inputs(place=3, queue=ProviderQueue(backlog=Backlog({"a": 3}), accounts={}, rendering=()),
                             limits=ProviderLimits(concurrency=10, rate_per_s=1 / 60)))
    assert paced.start_p50 == NOON + timedelta(minutes=2)


def test_no_times_without_enough_renders_while_paused_or_while_the_provider_is_held():
    few = estimate(_inputs(measured=Measured(samples=2, hold_p50_s=1, hold_p90_s=1, ready_p50_s=1, ready_p90_s=1)))
    paused = estimate(_inputs(queue=ProviderQueue(backlog=Backlog({}), accounts={}, rendering=(),
                                                  paused="new submissions are paused: invoice review")))
    held = estimate(_inputs(queue=ProviderQueue(backlog=Backlog({}), accounts={}, rendering=(),
                                                held="fake is unavailable")))

    for made, why in ((few, "too_few_renders"), (paused, "submissions_paused"), (held, "provider_unavailable")):
        assert made.times() == (None, None, None, None) and made.unavailable == why
    assert few.note == "only 2 renders of fake/default measured here in the last 24 h; an estimate needs 5"
    assert "invoice review" in paused.note and held.note == "fake is unavailable"


def test_an_estimate_has_moved_only_past_its_rounding():
    base = estimate(_inputs(place=1, queue=ProviderQueue(backlog=Backlog({"a": 1, "b": 1}), accounts={},
                                                         rendering=())))
    assert base.start_p90 is not None and base.jobs_ahead_p90 == 1
    later = msgspec.structs.replace(base, start_p90=base.start_p90 + timedelta(seconds=1))
    far = msgspec.structs.replace(base, start_p90=base.start_p90 + timedelta(seconds=2))
    fewer = msgspec.structs.replace(base, jobs_ahead_p90=0)

    assert not moved(base, base, NOON) and not moved(base, later, NOON)  # one rounding step: a boundary crossed
    assert moved(base, far, NOON) and moved(base, fewer, NOON) and moved(base, None, NOON)


def test_the_client_says_an_estimate_in_words():
    from vidjobs_client.models import QueueEstimate

    def local(at: datetime, shape: str) -> str:
        return at.astimezone().strftime(shape)

    soon = QueueEstimate(jobs_ahead=2, jobs_ahead_p90=3, start_p50=NOON + timedelta(seconds=130),
                         start_p90=NOON + timedelta(seconds=230), ready_p50=NOON + timedelta(minutes=20),
                         ready_p90=NOON + timedelta(minutes=25))
    now = QueueEstimate(jobs_ahead=0, jobs_ahead_p90=1, start_p50=NOON - timedelta(seconds=1),
                        start_p90=NOON + timedelta(seconds=3), ready_p50=NOON + timedelta(seconds=4),
                        ready_p90=NOON + timedelta(seconds=7))
    none = QueueEstimate(jobs_ahead=1, jobs_ahead_p90=1, unavailable="too_few_renders",
                         note="only 2 renders of fake/default measured here in the last 24 h; an estimate needs 5")

    assert soon.describe(NOON) == (f"2–3 jobs ahead; starts in about 2–4 min, ready by "
                                   f"{local(soon.ready_p50, '%H:%M')}–{local(soon.ready_p90, '%H:%M')}")
    assert now.describe(NOON) == (f"0–1 job ahead; starts in about 0–3 s, ready by "
                                  f"{local(now.ready_p50, '%H:%M:%S')}–{local(now.ready_p90, '%H:%M:%S')}")
    assert none.describe(NOON) == f"1 job ahead; no estimate yet: {none.note}"


# ---- the gateway: its words, its streams --------------------------------------------------------------------

@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, estimate_refresh_s=0.3)
    async with running_gateway(settings) as harness:
        yield harness


async def test_a_waiting_job_says_why_it_has_no_estimate(h):
    key = await h.key()
    _, job = await h.post_job(key)
    assert job["estimate"]["unavailable"] == "too_few_renders"
    assert job["estimate"]["note"] == ("no renders of fake/default measured here in the last 24 h; "
                                       "an estimate needs 5")
    assert (job["estimate"]["jobs_ahead"], job["estimate"]["start_p50"], job["estimate"]["ready_p90"]) == (0, None,
                                                                                                           None)

    await switch.set_submissions(h.pool, paused=True, reason="invoice review")

    async def says_paused():
        shown = (await h.get(key, f"/v1/jobs/{job['id']}"))[1]["estimate"]
        return shown if shown["unavailable"] == "submissions_paused" else None

    paused = await wait_until(says_paused, within=10, what="the estimate to say submissions are paused")
    assert paused["note"] == "new submissions are paused for the whole platform: invoice review"

    await switch.set_submissions(h.pool, paused=False)
    await h.pool.execute("INSERT INTO provider_breakers (provider, state, reopen_at) "
                         "VALUES ('fake', 'open', now() + interval '1 minute')")

    async def says_unavailable():
        shown = (await h.get(key, f"/v1/jobs/{job['id']}"))[1]["estimate"]
        return shown if shown["unavailable"] == "provider_unavailable" else None

    held = await wait_until(says_unavailable, within=10, what="the estimate to say the provider is unavailable")
    assert held["note"].startswith("fake is unavailable; submissions to it are paused until")


async def _ahead(h, key: str, job_id: str, expected: tuple[int, int]) -> bool:
    shown = (await h.get(key, f"/v1/jobs/{job_id}"))[1]["estimate"]
    return (shown["jobs_ahead"], shown["jobs_ahead_p90"]) == expected


async def test_a_stream_learns_of_a_moved_estimate_from_reads_every_stream_shares(h):
    mine, theirs = await h.key(), await h.key()
    my_ids = [(await h.post_job(mine))[1]["id"] for _ in range(2)]
    their_ids = [(await h.post_job(theirs))[1]["id"] for _ in range(3)]
    await wait_until(lambda: _ahead(h, mine, my_ids[1], (2, 3)), within=10, what="the queues read with every job")
    others = [await h.client.get(f"/v1/jobs/{j}/stream", headers=auth(theirs)) for j in their_ids]
    resp = await h.client.get(f"/v1/jobs/{my_ids[1]}/stream", headers=auth(mine))
    _, first = await read_event(resp)
    # My second job: my first ahead, and their first (p50) to their first two (p90).
    assert (first["estimate"]["jobs_ahead"], first["estimate"]["jobs_ahead_p90"]) == (2, 3)
    reads = metrics.ESTIMATE_READS.labels("provider")
    loop = asyncio.get_running_loop()
    began, reads_before = loop.time(), reads._value.get()

    # Their jobs leaving send hints about their queue, not mine: my stream learns of it from the shared reads.
    await h.client.delete(f"/v1/jobs/{their_ids[2]}", headers=auth(theirs))
    await h.client.delete(f"/v1/jobs/{their_ids[1]}", headers=auth(theirs))
    _, moved_up = await asyncio.wait_for(read_event(resp), 10)
    assert (moved_up["estimate"]["jobs_ahead"], moved_up["estimate"]["jobs_ahead_p90"]) == (2, 2)
    assert moved_up["queue_position"] == 2  # its place in my queue did not move

    # Four streams of waiting jobs were open all along: the provider's queue was read once per interval at
    # most, whoever asked, not once per stream.
    elapsed = loop.time() - began
    assert reads._value.get() - reads_before <= elapsed / h.settings.estimate_refresh_s + 2
    for open_stream in [resp, *others]:
        open_stream.close()


async def test_the_list_and_the_job_show_the_same_estimate(h):
    mine, theirs = await h.key(), await h.key()
    await h.post_job(theirs)
    ids = [(await h.post_job(mine))[1]["id"] for _ in range(3)]
    await wait_until(lambda: _ahead(h, mine, ids[0], (0, 1)), within=10, what="the queues read with every job")

    _, listed = await h.get(mine, "/v1/jobs")
    one_by_one = [(await h.get(mine, f"/v1/jobs/{j}"))[1]["estimate"] for j in ids]

    assert [j["estimate"] for j in reversed(listed["data"])] == one_by_one
    assert [(e["jobs_ahead"], e["jobs_ahead_p90"]) for e in one_by_one] == [(0, 1), (2, 2), (3, 3)]


# ---- the whole stack: estimates against what then happened -------------------------------------------------

RENDER_S = 1.0
MIN_SAMPLES = 3


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text)


class Timing(NamedTuple):
    """One job's times as the estimates measure them (vidjobs.common.estimates)."""

    submitted: datetime  # it took its slot
    rendered: datetime  # its render left the provider: the slot came free
    completed: datetime

    @property
    def hold_s(self) -> float:
        return (self.rendered - self.submitted).total_seconds()

    @property
    def ready_s(self) -> float:
        return (self.completed - self.submitted).total_seconds()


async def _timings(database_url: str, ids: list[str]) -> dict[str, Timing]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT id, submitted_at, rendered_at, completed_at FROM jobs WHERE id = ANY($1)",
                                ids)
    finally:
        await conn.close()
    return {r["id"]: Timing(r["submitted_at"], r["rendered_at"], r["completed_at"]) for r in rows}


class Leeway(NamedTuple):
    """How far a job's real times may fall outside its estimate, in seconds, from what this run measured: the
    estimate's own model leaves out the moment between one render letting go of the slot and the next taking
    it, and takes every hold to be one the warm-up measured. On a slow or busy machine both can be far off
    what they are on an idle one; what they were here is known once the jobs ended."""

    early_s: float  # the jobs ahead held the slot for less than the shortest hold measured
    late_s: float  # the slot stood free between renders, or the jobs ahead held it longer than the longest
    ready_early_s: float  # its own time from start to ready was shorter than the shortest measured
    ready_late_s: float  # ...or longer than the longest


def _leeway(job_id: str, queued: dict[str, Timing], warm: list[Timing], made_at: datetime) -> Leeway:
    """The leeway of `job_id` from the jobs that took the one slot after the estimate was made, up to it."""
    holds, readies = [t.hold_s for t in warm], [t.ready_s for t in warm]
    in_order = sorted(queued.items(), key=lambda item: item[1].submitted)
    early = late = 0.0
    for (_, before), (later_id, later) in zip(in_order, in_order[1:], strict=False):
        if before.rendered > made_at:  # a hold the estimate had to foresee, and the hand-over after it
            early += max(0.0, min(holds) - before.hold_s)
            late += max(0.0, before.hold_s - max(holds)) + (later.submitted - before.rendered).total_seconds()
        if later_id == job_id:
            break
    own = queued[job_id]
    return Leeway(early, late, early + max(0.0, min(readies) - own.ready_s),
                  late + max(0.0, own.ready_s - max(readies)))


def _within(actual: datetime, low: datetime, high: datetime, made_at: datetime, *, early_s: float,
            late_s: float) -> bool:
    """Whether `actual` fell in [low, high], give or take the run's own leeway, and 2 s or a quarter of how far
    ahead the estimate looked for the rounding and the reads."""
    slack = max(2.0, 0.25 * (high - made_at).total_seconds())
    return low - timedelta(seconds=slack + early_s) <= actual <= high + timedelta(seconds=slack + late_s)


async def test_queued_jobs_start_and_are_ready_within_their_estimates(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=ONE_SLOT,
                              estimate_min_samples=MIN_SAMPLES, estimate_refresh_s=0.5)
    key_b = await demo_key(database_url)
    async with running_stack(settings) as stack:
        theirs = stack.as_key(key_b)
        # Nothing measured yet: the jobs behind the first say there is no estimate, and why.
        warm = [await stack.create_job(params={"render_s": RENDER_S}) for _ in range(MIN_SAMPLES)]
        assert warm[-1]["status"] == "pending" and warm[-1]["estimate"]["unavailable"] == "too_few_renders"
        assert warm[-1]["estimate"]["start_p50"] is None
        assert "no renders of fake/default" in warm[-1]["estimate"]["note"]
        await asyncio.gather(*(stack.wait_terminal(j["id"]) for j in warm))

        # Measured now. Five jobs queue from two accounts while submissions are paused, which their estimates
        # say; once resumed, the first read that has times is one made after every job had joined the queue.
        owners = [stack, theirs, stack, theirs, stack]
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
        try:
            await switch.set_submissions(pool, paused=True, reason="queueing up")
            queued = [await who.create_job(params={"render_s": RENDER_S}) for who in owners]
            assert queued[0]["estimate"]["unavailable"] == "submissions_paused", queued[0]
            await switch.set_submissions(pool, paused=False)
        finally:
            await pool.close()
        last = queued[-1]["id"]

        async def estimated():
            shown = await stack.job(last)
            return shown if shown["estimate"]["unavailable"] is None else None

        await wait_until(estimated, within=10, what="the estimates to have times again")
        made_at = datetime.now(UTC)
        estimates = await asyncio.gather(*(who.job(j["id"]) for who, j in zip(owners, queued, strict=True)))
        seen_ahead = []

        async def watch_last_job():
            shown = await stack.job(last)
            if shown["status"] == "pending":
                seen_ahead.append(shown["estimate"]["jobs_ahead"])
            return shown["status"] != "pending"

        await wait_until(watch_last_job, within=60, interval=0.2, what="the last queued job to start")
        finished = await asyncio.gather(*(who.wait_terminal(j["id"]) for who, j in zip(owners, queued, strict=True)))
        timings = await _timings(database_url, [j["id"] for j in warm + queued])

    warm_timings = [timings[j["id"]] for j in warm]
    queued_timings = {j["id"]: timings[j["id"]] for j in queued}
    report = []
    for who, before, after in zip(["mine", "theirs"] * 3, estimates, finished, strict=False):
        e = before["estimate"]
        if before["status"] != "pending":
            continue  # it had started by the time the estimates were read
        assert e["unavailable"] is None and "renders of fake/default" in e["note"], e
        started, ready = _moment(after["started_at"]), _moment(after["completed_at"])
        leeway = _leeway(before["id"], queued_timings, warm_timings, made_at)
        report.append(f"{who:>6} {e['jobs_ahead']}-{e['jobs_ahead_p90']} ahead: start {e['start_p50'][11:19]}-"
                      f"{e['start_p90'][11:19]} (was {started:%H:%M:%S.%f}), ready {e['ready_p50'][11:19]}-"
                      f"{e['ready_p90'][11:19]} (was {ready:%H:%M:%S.%f}); leeway {leeway}")
        assert after["status"] == "completed"
        assert _within(started, _moment(e["start_p50"]), _moment(e["start_p90"]), made_at,
                       early_s=leeway.early_s, late_s=leeway.late_s), report[-1]
        assert _within(ready, _moment(e["ready_p50"]), _moment(e["ready_p90"]), made_at,
                       early_s=leeway.ready_early_s, late_s=leeway.ready_late_s), report[-1]
    print("\nestimated at", f"{made_at:%H:%M:%S.%f}", *report, sep="\n")
    # The last job, the one with the most ahead, was still waiting when the estimates were read (four renders
    # of at least RENDER_S each stood before it), so at least its estimate was held against what happened.
    assert estimates[-1]["status"] == "pending" and report, estimates
    # Its place moved up as the jobs ahead of it started, from where the estimates found it down to none ahead.
    places = [estimates[-1]["estimate"]["jobs_ahead"], *seen_ahead]
    assert places[0] >= 1 and places[-1] == 0, places
    assert places == sorted(places, reverse=True), places
