"""What this deployment measured of a model's renders: how long each held its provider slot (`submitted_at` to
`rendered_at`, when its render left the provider) and took from start to ready (`submitted_at` to
`completed_at`), over its jobs completed in the last `estimate_window_s`, at most the last `estimate_samples`.

The estimates of waiting jobs (vidjobs.common.estimates), the ready range of rendering ones
(vidjobs.common.render_estimates) and render deadlines (vidjobs.common.render_deadlines) read the same
figures. A module of its own, reading only `jobs`, so that a service needing only the figures (the poller, for
a render's deadline) is not given what the estimates read besides.
"""

from __future__ import annotations

import asyncpg
import msgspec

from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus, sql

Conn = asyncpg.Connection | asyncpg.Pool


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """A model's renders measured here: seconds each held a provider slot, and took from start to ready."""

    samples: int
    hold_p50_s: float = 0.0
    hold_p90_s: float = 0.0
    hold_p99_s: float = 0.0  # what a render's deadline starts from (vidjobs.common.render_deadlines)
    ready_p50_s: float = 0.0
    ready_p90_s: float = 0.0


# The model's most recent renders in the window (jobs_model_completed, newest first). A job completed before
# `rendered_at` existed counts its time to ready as its hold.
_MEASURED = f"""
SELECT count(*) AS samples,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY hold_s) AS hold_p50,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY hold_s) AS hold_p90,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY hold_s) AS hold_p99,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ready_s) AS ready_p50,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY ready_s) AS ready_p90
FROM (SELECT extract(epoch FROM COALESCE(j.rendered_at, j.completed_at) - j.submitted_at) AS hold_s,
             extract(epoch FROM j.completed_at - j.submitted_at) AS ready_s
      FROM jobs j
      WHERE j.model = $1 AND j.status = {sql(JobStatus.COMPLETED)}
        AND j.completed_at > clock_timestamp() - make_interval(secs => $2) AND j.submitted_at IS NOT NULL
      ORDER BY j.completed_at DESC
      LIMIT $3) AS recent
"""


async def read_measured(conn: Conn, model: str, settings: Settings) -> Measured:
    row = await conn.fetchrow(_MEASURED, model, settings.estimate_window_s, settings.estimate_samples)
    assert row is not None, "an aggregate without GROUP BY answers one row"
    if not row["samples"]:
        return Measured(samples=0)
    return Measured(samples=row["samples"], hold_p50_s=row["hold_p50"], hold_p90_s=row["hold_p90"],
                    hold_p99_s=row["hold_p99"], ready_p50_s=row["ready_p50"], ready_p90_s=row["ready_p90"])
