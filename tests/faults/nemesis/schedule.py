"""The fault schedule a seed makes, decided before the run begins, so a seed names the same faults at the same
moments every time and the schedule can be printed and read before anything breaks.

Faults overlap (up to `MAX_AT_ONCE`), but never two on one target at once, and never two of the NATS cluster's
three nodes at once: a cluster of three promises to keep going with one node gone, not two, and the nemesis
tests what the system promises. Each kind has its own range of durations, short enough that the load's
creates come through it (the API's promise is an answer within its deadline, and clients retry)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

MAX_AT_ONCE = 3
WARMUP_S = 8.0  # the load is under way before the first fault
QUIET_END_S = 10.0  # no fault begins this close to the end of the load, and every fault has ended by it


@dataclass(frozen=True)
class Kind:
    name: str
    targets: str  # which group of targets it hits (Targets' field names)
    lasts: tuple[float, float]  # seconds, drawn uniformly; (0, 0) for an instant (a SIGKILL)
    weight: float
    once: bool = False  # at most once a run (a failover leaves no standby to fail over to)


# The catalogue's kinds (catalogue.py says how each begins and ends).
KINDS: tuple[Kind, ...] = (
    Kind("kill_service", "workers", (0.0, 0.0), 4.0),  # SIGKILL; the supervisor restarts it
    Kind("kill_gateway", "gateway", (0.0, 0.0), 1.0),
    Kind("freeze_service", "workers", (2.0, 8.0), 3.0),  # SIGSTOP, then SIGCONT
    Kind("kill_nats_node", "nats_nodes", (3.0, 10.0), 2.0),  # SIGKILL, restarted on the same store
    Kind("freeze_nats_node", "nats_nodes", (2.0, 8.0), 2.0),
    Kind("stall_postgres", "postgres", (1.0, 4.0), 1.5),
    Kind("restart_postgres", "postgres", (0.0, 0.0), 1.0),  # immediate shutdown (a crash), then started
    Kind("failover_postgres", "postgres", (0.0, 0.0), 1.0, once=True),  # primary killed, standby promoted
    Kind("partition_postgres", "postgres", (1.0, 4.0), 1.0),  # the services cut off from PostgreSQL
    Kind("slow_postgres", "postgres", (3.0, 10.0), 1.0),  # 100-150 ms each way between them
    Kind("partition_nats_node", "nats_nodes", (2.0, 8.0), 1.5),  # the services cut off from one node
    Kind("stall_object_store", "object_store", (2.0, 8.0), 1.5),
    Kind("object_store_failing", "object_store", (2.0, 8.0), 1.0),  # every request answered 500
    Kind("object_store_unavailable", "object_store", (2.0, 8.0), 1.0),  # 503 SlowDown
    Kind("stall_provider", "provider", (2.0, 8.0), 1.0),
    Kind("provider_slow", "provider", (3.0, 10.0), 1.0),
    Kind("provider_rate_limited", "provider", (2.0, 8.0), 1.0),
    Kind("provider_unavailable", "provider", (2.0, 8.0), 1.0),
    Kind("provider_failing", "provider", (2.0, 6.0), 1.0),
    Kind("callbacks_twice", "provider", (5.0, 15.0), 1.0),
    Kind("callbacks_late", "provider", (5.0, 15.0), 1.0),
)
BY_NAME = {kind.name: kind for kind in KINDS}


@dataclass(frozen=True)
class Targets:
    workers: tuple[str, ...]  # service process names, two of each worker
    gateway: tuple[str, ...]
    nats_nodes: tuple[str, ...]
    postgres: tuple[str, ...] = ("postgres",)
    object_store: tuple[str, ...] = ("object_store",)
    provider: tuple[str, ...] = ("provider",)

    def of(self, kind: Kind) -> tuple[str, ...]:
        found: tuple[str, ...] = getattr(self, kind.targets)
        return found


@dataclass(frozen=True)
class Planned:
    at_s: float
    kind: str
    target: str
    lasts_s: float

    @property
    def ends_s(self) -> float:
        return self.at_s + self.lasts_s

    def __str__(self) -> str:
        span = f"for {self.lasts_s:4.1f}s" if self.lasts_s else "(instant)"
        return f"t={self.at_s:6.1f}s {self.kind:<22} {self.target:<14} {span}"


def _busy(plan: Iterable[Planned], at_s: float) -> list[Planned]:
    # An instant fault keeps its target for a moment: a process killed twice within a second tests nothing more.
    return [p for p in plan if p.at_s <= at_s < max(p.ends_s, p.at_s + 1.0)]


def _fits(candidate: Planned, plan: list[Planned]) -> bool:
    during = [p for p in plan if p.at_s < max(candidate.ends_s, candidate.at_s + 1.0)
              and candidate.at_s < max(p.ends_s, p.at_s + 1.0)]
    if len(_busy(during, candidate.at_s)) >= MAX_AT_ONCE:
        return False
    if any(p.target == candidate.target for p in during):
        return False
    if BY_NAME[candidate.kind].once and any(p.kind == candidate.kind for p in plan):
        return False
    nats = {BY_NAME[p.kind].targets for p in during} & {"nats_nodes"}
    return not (nats and BY_NAME[candidate.kind].targets == "nats_nodes")


def make(seed: int, seconds: float, targets: Targets, *, mean_gap_s: float = 4.0) -> list[Planned]:
    """The faults of a run of `seconds` of load: the moments are a Poisson process of mean gap `mean_gap_s`;
    a draw that would break the rules above is dropped (the next moment draws again)."""
    rng = random.Random(seed)
    plan: list[Planned] = []
    kinds = [k for k in KINDS if targets.of(k)]
    at_s = WARMUP_S
    last_s = seconds - QUIET_END_S
    while True:
        at_s += rng.expovariate(1.0 / mean_gap_s)
        if at_s >= last_s:
            return plan
        kind = rng.choices(kinds, weights=[k.weight for k in kinds])[0]
        lasts_s = round(min(rng.uniform(*kind.lasts), last_s - at_s), 1)
        candidate = Planned(round(at_s, 1), kind.name, rng.choice(targets.of(kind)), max(lasts_s, 0.0))
        if _fits(candidate, plan):
            plan.append(candidate)


def counted(plan: Iterable[Planned]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in plan:
        counts[p.kind] = counts.get(p.kind, 0) + 1
    return dict(sorted(counts.items()))
