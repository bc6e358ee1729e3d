"""Which due webhook deliveries a claim takes (services/gateway/appwebhooks/claims.py), against a real
PostgreSQL: accounts take turns (each one's oldest due delivery, then each one's second, ...), each account
holds exactly its in-flight cap and never more, a host whose share is taken is passed over for the account's
other hosts, the per-minute cap counts the minute's attempts, and nothing over a cap is dropped: it stays
pending and a later claim takes it. Attempts are settled as the deliverer settles them."""

from __future__ import annotations

import asyncpg

from vidjobs.gateway.accounts import create_account
from vidjobs.gateway.appwebhooks import deliveries
from vidjobs.gateway.appwebhooks.claims import HOST_OF_URL, Caps, Delivery, claim

HOLD_S = 600.0  # a claim outlasts the test: nothing comes due again by its claim running out
ROOMY = 1000  # a cap set this high stays out of the way of the one a test is about


class Backlog:
    """Deliveries written as the fan-out writes them, each named (`a1`: account a's oldest) and due an age ago."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.accounts: dict[str, str] = {}  # name -> account id
        self.names: dict[str, str] = {}  # delivery id -> name
        self.claimed: dict[str, Delivery] = {}  # name -> the delivery as claimed, until settled

    async def account(self, name: str) -> None:
        async with self.pool.acquire() as conn:
            self.accounts[name], _ = await create_account(conn, f"claims-{name}", credits=0, concurrency=1)

    async def due(self, name: str, url: str, age_s: float) -> None:
        """Delivery `name` of the account its first letter names, to `url`, due since `age_s` ago."""
        delivery_id = f"msg_{name}"
        await self.pool.execute(
            f"INSERT INTO webhook_deliveries (id, account_id, job_id, event_type, event_key, url, host, "
            f"next_attempt_at) VALUES ($1, $2, 'job_x', 'job.completed', $1, $3, {HOST_OF_URL.format(url='$3')}, "
            f"clock_timestamp() - make_interval(secs => $4))", delivery_id, self.accounts[name[0]], url, age_s)
        self.names[delivery_id] = name

    async def claim(self, caps: Caps, limit: int = 100) -> set[str]:
        """The names of the deliveries one claim took (a claim's rows come in no promised order)."""
        taken = await claim(self.pool, caps, limit, HOLD_S)
        for delivery in taken:
            self.claimed[self.names[delivery.id]] = delivery
        return {self.names[d.id] for d in taken}

    async def settle(self, *names: str) -> None:
        """Each claimed delivery's attempt answered 204, recorded as the deliverer records it."""
        for name in names:
            delivery = self.claimed.pop(name)
            await deliveries._settle(self.pool, delivery, deliveries.Outcome(204, None, 3), "delivered", None)

    async def in_flight(self) -> dict[str, int]:
        """Claimed and unsettled deliveries per account name, as every replica's claim counts them."""
        rows = await self.pool.fetch("SELECT account_id, count(*) AS n FROM webhook_deliveries "
                                     "WHERE status = 'pending' AND claimed_until > clock_timestamp() GROUP BY 1")
        by_id = {account_id: name for name, account_id in self.accounts.items()}
        return {by_id[r["account_id"]]: r["n"] for r in rows}

    async def pending(self) -> set[str]:
        rows = await self.pool.fetch("SELECT id FROM webhook_deliveries WHERE status = 'pending'")
        return {self.names[r["id"]] for r in rows}


async def test_accounts_take_turns_oldest_first_and_each_holds_exactly_its_cap(pool: asyncpg.Pool):
    backlog = Backlog(pool)
    for account in "abc":
        await backlog.account(account)
    # Account a's whole backlog is older than b's, b's than c's: oldest-first alone would take a's five first.
    # Every delivery has a host of its own, so only the account caps decide.
    for rank, account in enumerate("abc"):
        for n in range(1, 6):
            await backlog.due(f"{account}{n}", f"https://{account}{n}.example/hook", age_s=1000 - 100 * rank - n)
    caps = Caps(in_flight=3, per_minute=ROOMY, host_in_flight=ROOMY)  # 3: not the default (16)

    # One claim, seven places: each account's oldest, then each one's second, then a's third.
    first = await backlog.claim(caps, limit=7)
    # a holds its cap: only b and c take their thirds.
    second = await backlog.claim(caps)
    held = await backlog.in_flight()
    # Every account at its cap: nothing more, however many places the claim has.
    third = await backlog.claim(caps)
    await backlog.settle("a1", "a2", "a3")
    # a's attempts ended: a takes the rest of its backlog; b and c, still at their cap, take nothing.
    fourth = await backlog.claim(caps)

    assert first == {"a1", "b1", "c1", "a2", "b2", "c2", "a3"}
    assert second == {"b3", "c3"}
    assert held == {"a": 3, "b": 3, "c": 3}
    assert third == set()
    assert fourth == {"a4", "a5"}
    assert await backlog.in_flight() == {"a": 2, "b": 3, "c": 3}
    # Over the cap is waiting, not dropped.
    assert await backlog.pending() == set(backlog.names.values()) - {"a1", "a2", "a3"}


async def test_a_host_whose_share_is_taken_is_passed_over_for_the_accounts_other_hosts(pool: asyncpg.Pool):
    backlog = Backlog(pool)
    for account in "ab":
        await backlog.account(account)
    # a's oldest deliveries all go to one host; b has one there too; a's newer ones go to hosts of their own.
    for n in range(1, 4):
        await backlog.due(f"a{n}", f"https://busy.example/hook?n={n}", age_s=100 - n)
    await backlog.due("b1", "https://BUSY.example/other", age_s=90)  # the same host, spelt otherwise
    await backlog.due("a4", "https://quiet.example/hook", age_s=80)
    await backlog.due("a5", "https://calm.example/hook", age_s=70)
    caps = Caps(in_flight=ROOMY, per_minute=ROOMY, host_in_flight=2)

    # busy.example takes two: a's oldest and b's first (b's turn before a's second), then a's other hosts.
    first = await backlog.claim(caps)
    # busy.example's share is taken: a's deliveries there wait, nothing else does.
    second = await backlog.claim(caps)
    await backlog.settle("b1")
    # A place came free on busy.example: a's oldest waiting one there takes it.
    third = await backlog.claim(caps)

    assert first == {"a1", "b1", "a4", "a5"}
    assert second == set()
    assert third == {"a2"}
    assert await backlog.pending() == {"a1", "a2", "a3", "a4", "a5"}


async def test_the_per_minute_cap_counts_the_minutes_attempts_and_drops_nothing(pool: asyncpg.Pool):
    backlog = Backlog(pool)
    for account in "ab":
        await backlog.account(account)
    for n in range(1, 9):
        await backlog.due(f"a{n}", f"https://a{n}.example/hook", age_s=100 - n)
    caps = Caps(in_flight=3, per_minute=5, host_in_flight=ROOMY)

    first = await backlog.claim(caps)
    await backlog.settle(*first)
    # Three attempts this minute: two more, whatever the in-flight room.
    second = await backlog.claim(caps)
    await backlog.settle(*second)
    # Five this minute: a waits for the next one; b, with a budget of its own, is not held up.
    await backlog.due("b1", "https://b1.example/hook", age_s=10)
    third = await backlog.claim(caps)
    waiting = await backlog.pending()
    # The minute has passed (its attempts are moved back rather than waited out).
    await pool.execute("UPDATE webhook_attempts SET at = at - interval '61 seconds'")
    fourth = await backlog.claim(caps)

    assert first == {"a1", "a2", "a3"} and second == {"a4", "a5"}
    assert third == {"b1"}
    assert waiting == {"a6", "a7", "a8", "b1"}
    assert fourth == {"a6", "a7", "a8"}


async def test_a_backlog_on_a_host_with_room_left_does_not_keep_the_account_from_its_other_hosts(
        pool: asyncpg.Pool):
    backlog = Backlog(pool)
    await backlog.account("a")
    for n in range(1, 11):  # ten on a host that answers at once, then one elsewhere
        await backlog.due(f"a{n:02}", f"https://busy.example/hook?n={n}", age_s=100 - n)
    await backlog.due("a11", "https://quiet.example/hook", age_s=50)
    caps = Caps(in_flight=3, per_minute=ROOMY, host_in_flight=2)

    taken = [await backlog.claim(caps)]
    for _ in range(4):  # each claim comes after one attempt ends, as the deliverer claims when a place frees
        await backlog.settle(sorted(backlog.claimed)[0])
        taken.append(await backlog.claim(caps))

    # busy.example gives up its two places and no more: the account's third goes to its other host at once,
    # however many of its older deliveries wait for busy.example (read host by host past 2 x its room).
    assert taken[0] == {"a01", "a02", "a11"}, taken


async def test_deliveries_without_a_host_are_one_host_of_their_own_when_an_account_is_read_host_by_host(
        pool: asyncpg.Pool):
    backlog = Backlog(pool)
    await backlog.account("a")
    for n in range(1, 9):  # a backlog on one host, deeper than twice the account's room
        await backlog.due(f"a{n:02}", f"https://busy.example/hook?n={n}", age_s=100 - n)
    for n in (9, 10):  # written before deliveries recorded their host
        await backlog.due(f"a{n:02}", f"https://old{n}.example/hook", age_s=100 - n)
    await pool.execute("UPDATE webhook_deliveries SET host = NULL WHERE id IN ('msg_a09', 'msg_a10')")
    await backlog.due("a11", "https://quiet.example/hook", age_s=50)
    caps = Caps(in_flight=5, per_minute=ROOMY, host_in_flight=2)

    # Two for busy.example, two for the deliveries without a host (held as one host), and the quiet host.
    first = await backlog.claim(caps)
    await backlog.settle("a01")
    # One place for the account and one on busy.example: its next delivery, read from the account's head.
    second = await backlog.claim(caps)

    assert first == {"a01", "a02", "a09", "a10", "a11"}
    assert second == {"a03"}
