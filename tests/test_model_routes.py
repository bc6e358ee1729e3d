"""Model routes as live data: VIDJOBS_MODEL_ROUTES seeds the table, `vidjobs routes` changes it while a gateway
runs (taking effect within seconds, no restart), the pick sticks per account while shares hold across
accounts, a disable moves everyone off a route, every change is in the history, bad input changes nothing,
and `vidjobs routes compare` prints the figures of the jobs that came through an alias."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.gateway_harness import Harness, gateway_settings, running_gateway
from tests.support import Run, operator_command, wait_until
from vidjobs.cli.__main__ import main
from vidjobs.cli.exitcodes import Exit
from vidjobs.cli.routing import parse_since
from vidjobs.common import modelroutes
from vidjobs.common.settings import RouteShare
from vidjobs.common.states import JobStatus
from vidjobs.gateway.liveroutes import LiveRoutes
from vidjobs.providers import rollout

ALIAS = "house/default"
SEED = {ALIAS: [RouteShare(model="fake/default", share=100)]}


@pytest.fixture
def vidjobs(database_url: str):
    return operator_command(database_url)


@pytest.fixture
def vidjobs_here(database_url: str, monkeypatch: pytest.MonkeyPatch):
    """`vidjobs ...` called in this process (a thread of its own), for the many short refusals: the same
    `main` an operator's shell runs, without a new interpreter's start each time."""
    for name in [k for k in os.environ if k.startswith("VIDJOBS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("VIDJOBS_DATABASE_URL", database_url)

    def call(args: tuple[str, ...]) -> Run:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
        return Run(code, out.getvalue(), err.getvalue())

    async def run(*args: str) -> Run:
        return await asyncio.to_thread(call, args)

    return run


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


async def _picks(h: Harness, keys: list[str], per_account: int = 1) -> list[set[str]]:
    """The models each account's creates through the alias went to."""
    out = []
    for key in keys:
        models = set()
        for _ in range(per_account):
            status, job = await h.post_job(key, model=ALIAS)
            assert status == 201, job
            models.add(job["model"])
        out.append(models)
    return out


async def _aliases_of(h: Harness, key: str) -> dict[str, list[str]]:
    _, listing = await h.get(key, "/v1/models")
    return {m["id"]: m["aliases"] for m in listing["data"]}


async def _snapshot(database_url: str) -> tuple[list[asyncpg.Record], int]:
    conn = await asyncpg.connect(database_url)
    try:
        return (await conn.fetch("SELECT * FROM model_routes ORDER BY alias, model"),
                await conn.fetchval("SELECT count(*) FROM model_route_changes"))
    finally:
        await conn.close()


def test_the_pick_sticks_per_account_and_shares_hold_across_accounts():
    table = modelroutes.table_of([
        modelroutes.RouteRow(alias=ALIAS, model=m, share=s, enabled=True, version=7)
        for m, s in (("fake/default", 70), ("fake-poll/default", 20), ("luma/ray-2", 10))])
    accounts = [f"acct_{n}" for n in range(20_000)]
    picks = {a: rollout.route(ALIAS, table, a) for a in accounts}
    counts = Counter(model for model, _ in picks.values())

    assert all(rollout.route(ALIAS, table, a) == picks[a] for a in accounts[:500])  # the same every time
    assert {alias for _, alias in picks.values()} == {ALIAS}
    for model, share in (("fake/default", 0.70), ("fake-poll/default", 0.20), ("luma/ray-2", 0.10)):
        assert abs(counts[model] / len(accounts) - share) < 0.02, counts
    assert rollout.route("fake/default", table, "acct_1") == ("fake/default", None)  # not an alias: untouched
    # A new version deals the accounts again: the same shares, other accounts on each route.
    again = {a: rollout.route(ALIAS, {ALIAS: modelroutes.AliasRoutes(8, table[ALIAS].shares)}, a)[0]
             for a in accounts}
    assert sum(again[a] != picks[a][0] for a in accounts) > len(accounts) // 10


async def test_a_change_reaches_a_running_gateway_and_sticks_per_account(tmp_path, database_url, nats_url, vidjobs):
    # The periodic reread is an hour away: only the announcement at commit can bring the change this soon.
    settings = gateway_settings(tmp_path, database_url, nats_url, model_routes=SEED, routes_refresh_s=3600)
    async with running_gateway(settings) as h:
        keys = [await h.key() for _ in range(40)]
        seeded = await _picks(h, keys[:5])
        listed = await vidjobs("routes", "list", "--json")

        canary = await vidjobs("routes", "set", ALIAS, "fake/default=50", "fake-poll/default=50", "--reason",
                               "canary")
        await wait_until(lambda: _has_alias(h, keys[0], "fake-poll/default"), within=10,
                         what="the gateway to route by the new shares")
        split = await _picks(h, keys, per_account=3)

        rollback = await vidjobs("routes", "disable", "fake-poll/default", "--reason", "bad renders")
        await wait_until(lambda: _lacks_alias(h, keys[0], "fake-poll/default"), within=10,
                         what="the gateway to leave the disabled route")
        after = await _picks(h, keys, per_account=2)
        routes_of_jobs = await h.pool.fetch("SELECT DISTINCT route FROM jobs")
        history = await vidjobs("routes", "history", "--json")
        table = await vidjobs("routes", "list")

    assert seeded == [{"fake/default"}] * 5
    assert [(r["model"], r["share"], r["enabled"], r["percent"]) for r in _lines(listed.out)] == \
        [("fake/default", 100, True, 100.0)]
    assert canary.code == 0, canary.err
    assert all(len(models) == 1 for models in split), split  # every account stays on one route
    on = Counter(next(iter(models)) for models in split)
    assert set(on) == {"fake/default", "fake-poll/default"} and min(on.values()) >= 8, on  # 50/50 of 40
    assert rollback.code == 0, rollback.err
    assert after == [{"fake/default"}] * 40
    assert [r["route"] for r in routes_of_jobs] == [ALIAS]

    changes = _lines(history.out)
    assert [(c["action"], c["reason"]) for c in changes] == [("disable", "bad renders"), ("set", "canary"),
                                                             ("seed", "")]
    disable, change, seed = changes
    assert disable["id"] == int(rollback.out) and change["id"] == int(canary.out)
    assert seed["actor"].startswith("gateway@") and seed["before"] == []
    assert change["before"] == [{"model": "fake/default", "share": 100, "enabled": True}]
    assert change["after"] == disable["before"] == [{"model": "fake-poll/default", "share": 50, "enabled": True},
                                                    {"model": "fake/default", "share": 50, "enabled": True}]
    assert disable["after"][0] == {"model": "fake-poll/default", "share": 50, "enabled": False}
    assert all(c["db_user"] and c["at"] for c in changes) and "@" in change["actor"]
    assert "fake-poll/default" in table.out and "no" in table.out.split()


async def _has_alias(h: Harness, key: str, model: str) -> bool:
    return (await _aliases_of(h, key)).get(model) == [ALIAS]


async def _lacks_alias(h: Harness, key: str, model: str) -> bool:
    return (await _aliases_of(h, key)).get(model) == []


async def test_the_periodic_reread_catches_a_change_that_was_not_announced(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, model_routes=SEED, routes_refresh_s=0.5)
    async with running_gateway(settings) as h:
        key = await h.key()
        async with h.pool.acquire() as conn, conn.transaction():
            await conn.execute("ALTER TABLE model_routes DISABLE TRIGGER model_routes_notify")
            await conn.execute("UPDATE model_routes SET model = 'fake-poll/default', version = 99")
            await conn.execute("ALTER TABLE model_routes ENABLE TRIGGER model_routes_notify")
        await wait_until(lambda: _has_alias(h, key, "fake-poll/default"), within=10, what="the periodic reread")
        status, job = await h.post_job(key, model=ALIAS)

    assert status == 201 and job["model"] == "fake-poll/default"


async def test_the_setting_seeds_only_an_alias_the_table_lacks(pool):
    first = await modelroutes.seed(pool, SEED)
    other = {ALIAS: [RouteShare(model="fake-poll/default", share=1)],
             "video/best": [RouteShare(model="fake-poll/default", share=3)]}
    second = await modelroutes.seed(pool, other)
    found = await modelroutes.rows(pool)

    assert (first, second) == ([ALIAS], ["video/best"])
    assert [(r.alias, r.model, r.share, r.version) for r in found] == [
        (ALIAS, "fake/default", 100, 0), ("video/best", "fake-poll/default", 3, 0)]
    with pytest.raises(Exception, match="whole numbers"):
        modelroutes.check_seed({ALIAS: [RouteShare(model="fake/default", share=2.5)]})


BAD_SETS = [
    (["nope/model=5"], "unknown model(s) nope/model"),
    (["fake/default=-5"], "whole number"),
    (["fake/default=1.5"], "whole number"),
    (["fake/default"], "MODEL=SHARE"),
    (["fake/default=0", "fake-poll/default=0"], "add up to 0"),
    (["fake/default=1", "fake/default=2"], "named twice"),
]


async def test_bad_input_to_set_is_refused_clearly_and_changes_nothing(pool, database_url, vidjobs_here):
    vidjobs = vidjobs_here
    await modelroutes.seed(pool, {ALIAS: [RouteShare(model="fake/default", share=9),
                                          RouteShare(model="fake-poll/default", share=1)]})
    before = await _snapshot(database_url)
    refused = [(await vidjobs("routes", "set", ALIAS, *pairs), fragment) for pairs, fragment in BAD_SETS]
    real_alias = await vidjobs("routes", "set", "fake/default", "fake-poll/default=1")
    bad_alias = await vidjobs("routes", "set", "no alias", "fake/default=1")
    last_route = await vidjobs("routes", "disable", "fake/default", "--alias", "video/none")
    await vidjobs("routes", "disable", "fake-poll/default")
    only_route = await vidjobs("routes", "disable", "fake/default")
    restored = await vidjobs("routes", "set", ALIAS, "fake/default=9", "fake-poll/default=1")
    same = await vidjobs("routes", "set", ALIAS, "fake/default=9", "fake-poll/default=1")
    after = await _snapshot(database_url)

    for run, fragment in refused:
        assert run.code == Exit.USAGE and fragment in run.err and run.out == "", (fragment, run)
    assert real_alias.code == Exit.USAGE and "is a real model" in real_alias.err
    assert bad_alias.code == Exit.USAGE and "<family>/<name>" in bad_alias.err
    assert last_route.code == Exit.NOT_FOUND and "no route to fake/default in alias video/none" in last_route.err
    assert only_route.code == Exit.REFUSED and "nothing was changed" in only_route.err
    assert restored.code == 0 and restored.out.strip().isdigit()
    assert same.code == 0 and same.out == "" and "nothing changed" in same.err
    rows, changes = after
    # Only the one disable that was allowed changed anything, and set back: the same shares, enabled again.
    assert changes == before[1] + 2
    assert [(r["model"], r["share"], r["enabled"]) for r in rows] == \
        [(r["model"], r["share"], r["enabled"]) for r in before[0]]


async def _job(conn, job_id: str, account_id: str, model: str, status: JobStatus, *, prompt: str = "a fox",
               route: str = ALIAS, created: datetime, submitted_s: float | None = None,
               rendered_s: float | None = None, completed_s: float | None = None, code: str | None = None,
               credits: int | None = None, cost: int | None = None) -> None:
    def at(seconds: float | None) -> datetime | None:
        return None if seconds is None else created + timedelta(seconds=seconds)
    await conn.execute(
        """
        INSERT INTO jobs (id, account_id, status, model, provider, request, route, created_at, submitted_at,
                          rendered_at, completed_at, error, actual_credits, provider_cost_credits)
        VALUES ($1, $2, $3, $4, split_part($4, '/', 1), $5, $6, $7, $8, $9, $10, $11, $12, $13)
        """,
        job_id, account_id, status.value, model, {"model": model, "prompt": prompt}, route, created, at(submitted_s),
        at(rendered_s), at(completed_s), None if code is None else {"code": code, "message": "m"}, credits, cost)


async def test_compare_prints_each_routes_figures(pool, database_url, vidjobs):
    now = datetime.now(UTC)
    base = now - timedelta(hours=10)
    async with pool.acquire() as conn:
        for account in ("acct_a", "acct_b"):
            await conn.execute("INSERT INTO accounts (id, name) VALUES ($1, $1)", account)
        done = dict(submitted_s=5, completed_s=None)
        # fake/default: four completed (render 10/20/30/40 s, ready 15/25/35/45 s), two failed, one canceled.
        for n, render in enumerate((10, 20, 30, 40)):
            await _job(conn, f"job_d{n}", "acct_a", "fake/default", JobStatus.COMPLETED,
                       prompt=" A fox  in\tSnow " if n == 0 else f"prompt {n}", created=base + timedelta(minutes=n),
                       **{**done, "rendered_s": 5 + render, "completed_s": 15 + 10 * n}, credits=10 * (n + 1), cost=5)
        await _job(conn, "job_f1", "acct_a", "fake/default", JobStatus.FAILED, created=base, code="timeout",
                   credits=0)
        await _job(conn, "job_f2", "acct_a", "fake/default", JobStatus.FAILED, created=base,
                   code="provider_unavailable", credits=0)
        await _job(conn, "job_c", "acct_a", "fake/default", JobStatus.CANCELED, created=base)
        # fake-poll/default: two completed (render 100/200 s, ready 110/210 s), then three follow-ups waiting.
        for n, render in enumerate((100, 200)):
            await _job(conn, f"job_p{n}", "acct_b", "fake-poll/default", JobStatus.COMPLETED, created=base,
                       submitted_s=5, rendered_s=5 + render, completed_s=110 + 100 * n, credits=50)
        first_done = base + timedelta(seconds=15)
        # job_d0 regenerated: the same account, alias and prompt (once normalised) ten minutes after it.
        await _job(conn, "job_r1", "acct_a", "fake-poll/default", JobStatus.PENDING, prompt="a fox in snow",
                   created=first_done + timedelta(minutes=10))
        # job_d1's prompt again, but two hours on (past the window); job_d2's, but by another account.
        await _job(conn, "job_r2", "acct_a", "fake-poll/default", JobStatus.PENDING, prompt="prompt 1",
                   created=base + timedelta(minutes=1, seconds=25, hours=2))
        await _job(conn, "job_r3", "acct_b", "fake-poll/default", JobStatus.PENDING, prompt="prompt 2",
                   created=base + timedelta(minutes=3))
        # Neither another alias's jobs nor older ones count.
        await _job(conn, "job_x", "acct_a", "fake/default", JobStatus.FAILED, route="other/alias", created=base,
                   code="timeout")
        await _job(conn, "job_old", "acct_a", "fake/default", JobStatus.FAILED, created=now - timedelta(days=3),
                   code="timeout")

    as_json = await vidjobs("routes", "compare", ALIAS, "--since", "1d", "--json")
    table = await vidjobs("routes", "compare", ALIAS, "--since", (now - timedelta(days=1)).isoformat())

    assert as_json.code == 0, as_json.err
    by_model = {f["model"]: f for f in _lines(as_json.out)}
    assert set(by_model) == {"fake/default", "fake-poll/default"}
    fake, poll = by_model["fake/default"], by_model["fake-poll/default"]
    assert fake == {
        "model": "fake/default", "jobs": 7, "completed": 4, "failed": 2,
        "render_p50_s": 25.0, "render_p90_s": 37.0, "ready_p50_s": 30.0, "ready_p90_s": 42.0,
        "failure_rate": pytest.approx(2 / 6), "failures_by_code": {"provider_unavailable": pytest.approx(1 / 6),
                                                                   "timeout": pytest.approx(1 / 6)},
        "regenerate_rate": 0.25, "credits_per_job": pytest.approx(100 / 6), "provider_cost_per_job": 5.0}
    assert poll == {
        "model": "fake-poll/default", "jobs": 5, "completed": 2, "failed": 0,
        "render_p50_s": 150.0, "render_p90_s": 190.0, "ready_p50_s": 160.0, "ready_p90_s": 200.0,
        "failure_rate": 0.0, "failures_by_code": {}, "regenerate_rate": 0.0, "credits_per_job": 50.0,
        "provider_cost_per_job": None}
    assert table.code == 0, table.err
    rows = {line.split()[0]: line for line in table.out.splitlines()[1:]}
    assert set(rows) == {"fake/default", "fake-poll/default"}
    assert "33.3%" in rows["fake/default"] and "25.0%" in rows["fake/default"] and "timeout 16.7%" in rows[
        "fake/default"]


def test_since_reads_a_span_or_a_moment():
    now = datetime(2025, 6, 2, tzinfo=UTC)
    assert parse_since("24h", now) == datetime(2025, 6, 1, tzinfo=UTC)
    assert parse_since("90m", now) == now - timedelta(minutes=90)
    assert parse_since("2025-06-01T12:00:00") == datetime(2025, 6, 1, 12, tzinfo=UTC)
    with pytest.raises(Exception, match="ISO 8601"):
        parse_since("yesterday")


@pytest.mark.parametrize("turns", range(6))
async def test_the_reread_loop_ends_when_cancelled_as_a_change_is_announced(pool, database_url, turns):
    """A gateway stops its tasks by cancelling them (on a start refused part-way, before anything sets its stop
    event): a cancel that lands as an announcement wakes the loop must end it, not be lost to the wake-up with
    the loop rereading on. `turns` moves the cancel across the loop's steps between the announcement and the
    reread."""
    routes = LiveRoutes(pool, database_url, frozenset({"fake/default"}), refresh_s=3600)
    read, reread_after_cancel = asyncio.Event(), asyncio.Event()
    cancelled = False
    load = routes.load

    async def counted_load() -> None:
        await load()
        (reread_after_cancel if cancelled else read).set()

    routes.load = counted_load  # type: ignore[method-assign]
    loop = asyncio.create_task(routes.run(asyncio.Event()))
    await read.wait()  # listening, table read once: now waiting for an announcement (the refresh is an hour)
    assert routes._listener is not None

    routes._announced()  # what its LISTEN connection calls on a NOTIFY, called here at a known step
    for _ in range(turns):
        await asyncio.sleep(0)
    loop.cancel()
    cancelled = True
    went_on = asyncio.create_task(reread_after_cancel.wait())
    await asyncio.wait({loop, went_on}, return_when=asyncio.FIRST_COMPLETED)
    went_on.cancel()

    assert loop.cancelled(), "the loop swallowed its cancel and kept running"
    assert not reread_after_cancel.is_set()
    assert routes._listener is None  # its own LISTEN connection closed on the way out
