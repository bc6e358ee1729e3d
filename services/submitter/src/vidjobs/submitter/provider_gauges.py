"""Gauges of each provider as every submitter sees it: its circuit breaker's state (and whether the provider's
refusing our account holds it open) and its renders in flight.

Both live in PostgreSQL, shared by every submitter replica, so every replica exports the same values: query
them with max() across replicas, never sum() (docs/RUNBOOK.md). Read on a timer, not per scrape: the breakers
are one row per provider, and renders in flight are counted from jobs_provider_active, which holds only
jobs at a provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from prometheus_client import Gauge

from vidjobs.common.breakers import REFUSALS, BreakerState
from vidjobs.common.runtime import Runtime, every
from vidjobs.common.states import SQL_RENDERING

REFRESH_S = 10.0

BREAKER = Gauge("vidjobs_provider_breaker_state",
                "1 for the state each provider's circuit breaker is in (closed, open, half_open), 0 for the others",
                ["provider", "state"])
# What an operator is alerted on while it lasts: a provider refusing our account waits for a person, not time.
REFUSING = Gauge("vidjobs_provider_refusing",
                 "1 while a provider's circuit breaker is held open because it refuses our account, by the code it "
                 "refused with (quota_exhausted: out of credit; provider_misconfigured: our key or call), 0 otherwise",
                 ["provider", "code"])
IN_FLIGHT = Gauge("vidjobs_provider_renders_in_flight", "Jobs submitted to or rendering at each provider",
                  ["provider"])

# Spelled as jobs_provider_active's predicate (migration 0002) so that the planner uses that index.
IN_FLIGHT_SQL = f"""
    SELECT provider, count(*) AS renders FROM jobs
    WHERE status IN {SQL_RENDERING} AND deleted_at IS NULL
    GROUP BY provider
"""


async def refresh(rt: Runtime, providers: Iterable[str]) -> None:
    rows = await rt.pool.fetch("SELECT provider, state, cause FROM provider_breakers")
    states = {r["provider"]: r["state"] for r in rows}
    refusing = {r["provider"]: r["cause"] for r in rows if r["state"] != BreakerState.CLOSED}
    renders = {r["provider"]: r["renders"] for r in await rt.pool.fetch(IN_FLIGHT_SQL)}
    for provider in sorted({*providers, *states, *renders}):
        current = states.get(provider, BreakerState.CLOSED)  # a provider that never failed has no breaker row
        for state in BreakerState:
            BREAKER.labels(provider, state).set(1 if state == current else 0)
        for code in sorted(REFUSALS):
            REFUSING.labels(provider, code).set(1 if refusing.get(provider) == code else 0)
        IN_FLIGHT.labels(provider).set(renders.get(provider, 0))


async def run(rt: Runtime, providers: Iterable[str]) -> None:
    await every(rt, REFRESH_S, partial(refresh, rt, tuple(providers)), "provider gauges")
