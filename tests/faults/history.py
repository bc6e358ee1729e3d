"""What a fault run's load did and saw through the public API, filled while it runs, and what the history
checker (checker.py) reports against it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Receipt:
    """One app-webhook delivery a receiver of the load got (an attempt answered 2xx)."""

    endpoint_id: str  # the endpoint whose URL received it
    event_id: str  # its `webhook-id` header: the delivery's id, the same on every attempt
    event_type: str  # the body's `type`
    job_id: str  # the body's `data.id`
    verified: bool  # its signature checked against the endpoint's secret


@dataclass
class History:
    seed: int
    acknowledged: dict[str, str] = field(default_factory=dict)  # job id -> account id, every create answered 2xx
    accounts: dict[str, str] = field(default_factory=dict)  # account id -> its API key
    canceled: set[str] = field(default_factory=set)  # job ids whose cancel was answered 2xx
    deleted: set[str] = field(default_factory=set)  # job ids whose delete was answered 2xx
    endpoints: dict[str, str] = field(default_factory=dict)  # webhook endpoint id -> account id
    received: list[Receipt] = field(default_factory=list)  # every delivery the load's receivers got
    balances_before: dict[str, int] = field(default_factory=dict)  # account id -> balance when the load began
    # Added for the money promise: credits the load granted each account during the run (a platform grant),
    # and when the load began, so that only settlements made since count (None: every settlement of the
    # account, right for accounts made for the run).
    grants: dict[str, int] = field(default_factory=dict)
    began_at: datetime | None = None


@dataclass(frozen=True)
class Violation:
    promise: str  # the promise broken: one of checker.PROMISES
    job_id: str | None  # the job it concerns; None for an account's, a service's or an object's
    detail: str
    seed: int | None = None  # the run's seed, set by check_history so a report can be replayed

    def __str__(self) -> str:
        job = self.job_id or "-"
        return f"[{self.promise}] job {job} (seed {self.seed}): {self.detail}"
