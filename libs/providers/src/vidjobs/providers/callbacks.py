"""Our attempt carried in a callback URL, for a provider that echoes the URL back: its query names our job and
attempt, so a provider with no idempotency key can still be asked which of its jobs is an attempt's."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit


def tagged(callback_url: str | None, job_id: str, attempt: int) -> str | None:
    """Our callback URL with the job id and attempt added to its query; None stays None (no callbacks)."""
    if not callback_url:
        return None
    joiner = "&" if urlsplit(callback_url).query else "?"
    return callback_url + joiner + urlencode({"job": job_id, "attempt": attempt})


def attempt_of(callback_url: str | None) -> tuple[str | None, int | None]:
    """The job id and attempt a `tagged` URL carries; None for either one it lacks."""
    query = parse_qs(urlsplit(callback_url).query) if callback_url else {}
    job, attempt = query.get("job", [None])[0], query.get("attempt", [""])[0]
    return job, int(attempt) if attempt.isdigit() else None
