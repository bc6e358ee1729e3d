"""A submit whose outcome stays unclear: how it is resolved at once, and how long its attempt is kept after.

A call that times out, or loses its connection after the request went out, may have been accepted. It is
resolved at once with a few more calls under the same idempotency key (`RESOLVING`: the render looked up
where the provider allows it, else asked for again). Any answer of the provider's (accepted, refused) ends
that. When none comes at all, the provider is not answering (stopped, paused, a proxy holding requests), and
what it was sent may still be rendered once it runs again: a new attempt, under a new key, would then be a
second render of the job, paid for. So the attempt is kept (`keep`):

- its claim is held a while longer, so it still counts against the provider's and the account's caps (the
  provider may be holding the call) and keeps the job out of the queue's head and out of failover;
- the job stays pending, parked, its wait reason saying so, and the provider's breaker hears the failure, so
  other jobs stop piling calls onto a provider that answers nothing;
- when the claim runs out, the queue sweep hands the job a slot again and the stale claim is taken over as
  any is, with one call (`LOOKING_AGAIN`): the render looked up, else submitted under the same key. A
  callback the provider sends meanwhile is adopted by the poller, and the job moves on without another call.

Each hold lasts as long as the outcome has been unclear so far (so the calls thin out, doubling), at least
one call budget and at most one claim TTL (an unanswered claim counts against the caps while it lasts).
Only an attempt unclear for longer than `unclear_submit_limit_s` since its first call is given up: refused as
a timeout, so a new attempt follows, and a late render of the old one is stopped when its signal arrives.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from vidjobs.common import backoff
from vidjobs.common.errors import ProviderError
from vidjobs.providers.base import SubmitRequest
from vidjobs.submitter.submissions import Claim

# Calls made to resolve one unclear submit outcome at once; when none is answered, the attempt is kept.
UNCLEAR_CALLS = 3


def is_unclear(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.unclear


# Calls about one attempt whose outcome stays unclear: the same key, a little later each time.
RESOLVING = backoff.Backoff(on=is_unclear, attempts=UNCLEAR_CALLS, timeout=None, base=1.0, cap=5.0)
# A kept attempt looked at again: one call (a look-up, then a submit under the key), since every request a
# provider that ignores keys and allows no look-up keeps may become a render of its own once it runs again.
LOOKING_AGAIN = backoff.Backoff(on=is_unclear, attempts=1, timeout=None)


def resolving(claim: Claim) -> backoff.Backoff:
    """The calls a claimed attempt's submit may make while its outcome stays unclear."""
    return LOOKING_AGAIN if claim is Claim.UNCLEAR else RESOLVING


# $1 job, $2 attempt, $3 shortest hold, $4 longest hold, $5 limit, $6 claim TTL (all seconds). The claim's
# clock is set so that it goes stale when the hold ends; a row already answered, or first claimed longer
# than the limit ago, is not held.
_HOLD = """
WITH hold AS (
    SELECT id, LEAST($4::float8, GREATEST($3::float8, extract(epoch FROM clock_timestamp() - created_at)::float8)) AS s
    FROM provider_submissions
    WHERE job_id = $1 AND attempt = $2 AND provider_job_id IS NULL AND answered_at IS NULL
      AND created_at > clock_timestamp() - make_interval(secs => $5::float8)
)
UPDATE provider_submissions p SET claimed_at = clock_timestamp() + make_interval(secs => hold.s - $6::float8),
                                  unclear_at = clock_timestamp()
FROM hold WHERE p.id = hold.id
RETURNING p.claimed_at + make_interval(secs => $6::float8) AS look_again_at
"""


async def keep(
    conn: asyncpg.Connection, req: SubmitRequest, *, shortest_s: float, claim_ttl_s: float, limit_s: float,
) -> datetime | None:
    """Hold the attempt's claim until its next look, and return when that is; None when the attempt is past
    `limit_s` (or was answered meanwhile), to be given up. Call under the provider's lock."""
    longest = max(shortest_s, claim_ttl_s)
    look_again_at: datetime | None = await conn.fetchval(
        _HOLD, req.job_id, req.attempt, shortest_s, longest, limit_s, claim_ttl_s)
    return look_again_at


def wait_reason(provider: str, look_again_at: datetime) -> str:
    return (f"{provider} is not answering; its answer to this job's submission may still come, so it is asked "
            f"again under the same key at {look_again_at:%H:%M:%S} UTC rather than sent anew")
