"""When will a render under way be ready? A range (p50 to p90) from what this deployment measured of the model's
renders, for a job at its provider (submitted or processing), or, in plain words, why there is none.

A waiting job's estimate (vidjobs.common.estimates) says when it starts and is ready; once it has started,
this says when it is ready, so that a provider that sends no progress still leaves a person something better
than a spinner. The model is the simplest one the measurements allow:

- Ready is the render's start (`submitted_at`, its current attempt's) plus how long the model's renders took
  from start to ready (p50, p90 of `submitted_at` to `completed_at`, the copy and thumbnails included): the
  very figures the waiting jobs' estimates and the render deadlines read (vidjobs.common.measurements, at
  most once per model and `estimate_refresh_s` per process). Rounded as the estimates are: p50 down, p90 up.
- With fewer than `estimate_min_samples` renders measured there is no range (`too_few_renders`).
- Once the late end (p90) has passed, the render is taking longer than nine in ten of those measured, and
  nothing measured says when it ends (`overdue`). Either way the render's deadline (the job's `deadline_at`)
  is the most it is given before it is stopped: a bound on waiting, not a time it will be ready by.

Left out: how far the render has got (a provider's own progress figure is shown as reported, never turned
into time), the provider's own queue (the job's `queue_position` where the provider reports one), and a
download that is slower than those measured.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import msgspec

from vidjobs.common.estimates import rounded, span, times_moved
from vidjobs.common.jobs import JobRow
from vidjobs.common.measurements import Measured
from vidjobs.common.settings import Settings
from vidjobs.common.states import RENDERING

# Why a render under way has no times (its `note` says it in words).
NoRange = Literal["too_few_renders", "overdue"]


class ReadyRange(msgspec.Struct, frozen=True, kw_only=True):
    """When a job at its provider is likely to be ready: from the typical case (p50) to a late one (p90)."""

    ready_p50: datetime | None  # may lie in the past: it may be ready any moment
    ready_p90: datetime | None
    unavailable: NoRange | None = None  # why there are no times; None when there are
    note: str  # in words: what the times rest on, or why there are none


def _renders(n: int) -> str:
    return f"{n} render{'' if n == 1 else 's'}"


def ready_range(job: JobRow, measured: Measured, settings: Settings, now: datetime) -> ReadyRange | None:
    """The range of a job at its provider, from its model's measured renders; None for any other job."""
    if job.status not in RENDERING or job.deleted_at is not None or job.submitted_at is None:
        return None
    if measured.samples < settings.estimate_min_samples:
        have = f"only {_renders(measured.samples)}" if measured.samples else "no renders"
        return ReadyRange(ready_p50=None, ready_p90=None, unavailable="too_few_renders",
                          note=f"{have} of {job.model} measured here in the last {span(settings.estimate_window_s)};"
                               f" an estimate needs {settings.estimate_min_samples}; it is stopped at its deadline")
    late_s = max(measured.ready_p90_s, measured.ready_p50_s)
    likely = job.submitted_at + timedelta(seconds=measured.ready_p50_s)
    late = job.submitted_at + timedelta(seconds=late_s)
    if late < now:
        return ReadyRange(ready_p50=None, ready_p90=None, unavailable="overdue",
                          note=f"it has taken longer than 9 in 10 of the last {_renders(measured.samples)} of "
                               f"{job.model} measured here ({span(late_s)} from start to ready); it is stopped at "
                               "its deadline")
    return ReadyRange(ready_p50=rounded(now, (likely - now).total_seconds(), up=False),
                      ready_p90=rounded(now, (late - now).total_seconds(), up=True),
                      note=f"from its start and the last {_renders(measured.samples)} of {job.model} measured here "
                           f"({span(measured.ready_p50_s)} to {span(late_s)} from start to ready)")


def moved(old: ReadyRange | None, new: ReadyRange | None, now: datetime) -> bool:
    """Whether `new` tells a person something `old` did not: times appearing or going, or a time that moved by
    more than the rounding at its distance (new measurements, not a rounding boundary crossed)."""
    if old is None or new is None:
        return old is not new
    if old.unavailable != new.unavailable:
        return True
    return times_moved(((old.ready_p50, new.ready_p50), (old.ready_p90, new.ready_p90)), now)
