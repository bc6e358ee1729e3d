"""When retention removes a completed job's original, as the reaper acts on it and every read shows it.

The window counts from `completed_at`. Its app is warned `job.expiring` the warning's lead before the end
of it, and the original is removed no sooner than that lead after the warning: normally both at the window's
end, later for a job released from keeping after its window ran out (it is warned then, and kept the lead
more). A kept job is never removed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from vidjobs.common.jobs import JobRow
from vidjobs.common.settings import Settings

DAY_S = 86400.0


def warning_lead_s(settings: Settings) -> float:
    """How long before removal the warning goes: the setting, but never more than the retention itself."""
    return max(0.0, min(settings.expiry_warning_days, settings.retention_days)) * DAY_S


def removal_at(job: JobRow, settings: Settings, now: datetime) -> datetime | None:
    """When a completed job's original is due to be removed; None while it is kept."""
    if job.kept_at is not None or job.completed_at is None:
        return None
    end = job.completed_at + timedelta(days=settings.retention_days)
    lead = timedelta(seconds=warning_lead_s(settings))
    if not lead:
        return end
    # Not warned yet: the warning goes at end - lead, or at the next sweep if that moment has passed.
    warned = job.expiry_warned_at or max(now, end - lead)
    return max(end, warned + lead)
