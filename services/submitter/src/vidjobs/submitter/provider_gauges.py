"""Gauges of each provider as every submitter sees it: its circuit breaker's state and its renders in flight.

Both live in PostgreSQL, shared by every submitter replica, so every replica exports the same values: query
them with max() across replicas, never sum() (docs/RUNBOOK.md). Read on a timer, not per scrape: the breakers
are one row per provider, and renders in flight are counted from jobs_provider_active, which holds only
jobs at a provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from prometheus_client import Gauge

from vidjobs.common.breakers import BreakerState
from vidjobs.common.runtime import Runtime, every
from vidjobs.common.states import SQL_RENDERING

REFRESH_S = 10.0

BREAKER = Gauge("vidjobs_provider_breaker_state",
                "1 for the state each provider's circuit breaker is in (closed, open, half_open), 0 for the others",
                ["provider", "state"])
IN_FLIGHT = Gauge("vidjobs_provider_renders_in_flight", "Jobs submitted to or rendering at each provider",
                  ["provider"])

# Spelled as jobs_provider_active's predicate (migration 0002) so that the planner uses that index.
IN_FLIGHT_SQL = f"""
    SELECT provider, count(*) AS renders FROM jobs
    WHERE status IN {SQL_RENDERING} AND deleted_at IS NULL
    GROUP BY provider
"""


async def refresh(rt: Runtime, providers: Iterable[str]) -> None:
    states = {r["provider"]: r["state"] for r in await rt.pool.fetch("SELECT provider, state FROM provider_breakers")}
    renders = {r["provider"]: r["renders"] for r in await rt.pool.fetch(IN_FLIGHT_SQL)}
    for provider in sorted({*providers, *states, *renders}):
        current = states.get(provider, BreakerState.CLOSED)  # a provider that never failed has no breaker row
        for state in BreakerState:
            BREAKER.labels(provider, state).set(1 if state == current else 0)
        IN_FLIGHT.labels(provider).set(renders.get(provider, 0))


async def run(rt: Runtime, providers: Iterable[str]) -> None:
    await every(rt, REFRESH_S, partial(refresh, rt, tuple(providers)), "provider gauges")
