"""When to try again: bounded by attempts and elapsed time, exponential backoff with full jitter, and never
for errors that cannot succeed on a second try."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import msgspec

from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.render_deadlines import DeadlineRule
from vidjobs.common.settings import Settings


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    max_attempts: int = 3
    base_s: float = 2.0
    cap_s: float = 60.0
    max_elapsed_s: float = 3600.0  # from the job's creation; no retry is made that would start past it
    # A render past its deadline is tried again (a new paid render) only where the provider's policy says so.
    retry_on_timeout: bool = False

    @classmethod
    def from_settings(cls, settings: Settings, provider: str | None = None) -> RetryPolicy:
        """The global policy, with the provider's overrides from VIDJOBS_RETRY_POLICIES on top. Unless the
        provider sets its own `max_elapsed_s`, the bound is `elapsed_bound` of its render deadlines and of the
        attempts and backoff cap it ends up with."""
        policy = cls(max_attempts=settings.max_attempts, base_s=settings.retry_base_s, cap_s=settings.retry_cap_s)
        overrides = settings.retry_policies.get(provider or "")
        changes = {} if overrides is None else \
            {k: v for k, v in msgspec.to_builtins(overrides).items() if v is not None}
        policy = msgspec.structs.replace(policy, **changes)
        if "max_elapsed_s" in changes:
            return policy
        rule = DeadlineRule.for_provider(settings, provider or "")
        return msgspec.structs.replace(policy, max_elapsed_s=elapsed_bound(rule, policy))


def elapsed_bound(rule: DeadlineRule, policy: RetryPolicy) -> float:
    """As long as a job's attempts may take by the provider's own rules: each render up to the longest deadline
    it may be given (the ceiling once its model is measured, the fixed deadline until then, whichever is longer)
    and each backoff between them up to its cap. A bound any shorter ends retries a provider with slow renders
    is owed (an hour-long render's second attempt would never come); a longer one lets a job that a rate limit
    keeps refusing (which spends no attempt) retry past what any run of its attempts could take. Time spent
    queued for a render slot counts too, as it is measured from the job's creation."""
    longest_render_s = max(rule.ceiling_s, rule.unmeasured_s)
    return policy.max_attempts * longest_render_s + max(0, policy.max_attempts - 1) * policy.cap_s


class Policies:
    """Retry policy by provider, built once per process."""

    def __init__(self, settings: Settings):
        self._settings = settings
        self._default = RetryPolicy.from_settings(settings)
        # A provider's own retry policy or render deadlines make its policy its own.
        own = {*settings.retry_policies, *settings.render_deadlines}
        self._by_provider = {p: RetryPolicy.from_settings(settings, p) for p in own}

    def for_provider(self, provider: str) -> RetryPolicy:
        return self._by_provider.get(provider, self._default)


def spends_attempt(error: JobError) -> bool:
    """A rate limit means the provider never started: waiting it out costs no attempt."""
    return error.code is not ErrorCode.RATE_LIMITED


def next_retry(
    policy: RetryPolicy, error: JobError, *, attempt: int, created_at: datetime, now: datetime,
    retry_after: float | None = None,
) -> datetime | None:
    """When to retry, or None to give up."""
    if not error.retryable:
        return None
    if error.code is ErrorCode.RENDER_TIMEOUT and not policy.retry_on_timeout:
        return None  # its owner decides whether another paid render is worth it (POST /v1/jobs/{id}/rerun)
    if spends_attempt(error) and attempt >= policy.max_attempts:
        return None
    delay = random.uniform(0, min(policy.cap_s, policy.base_s * 2 ** (attempt - 1)))
    if retry_after is not None:
        delay = max(delay, retry_after)  # the provider's pacing is a floor, never shortened by jitter
    when = now + timedelta(seconds=delay)
    if (when - created_at).total_seconds() > policy.max_elapsed_s:
        return None
    return when
