"""What counts as a call to a provider still in flight: its submission row (provider_submissions) claimed, not
answered yet, and claimed within the window. An older unanswered claim belongs to a submitter that died
mid-call (the submitter's claim TTL bounds every live call), so it holds nothing any more.

One spelling for every reader: the submitter counts these calls against provider and account caps and keeps
their jobs out of the queue's head; the gateway accepts a verified callback that may be about one of them.
Measured with clock_timestamp(), not now(): a transaction that has waited for a lock judges a claim's age at
the moment it reads it, not by when the transaction began.
"""

from __future__ import annotations


def unanswered_call(window: str, alias: str | None = None) -> str:
    """The predicate of a provider_submissions row (named `alias`, if the query names it) that is a call in
    flight; `window` is the SQL for its length in seconds, usually a parameter (`"$2"`)."""
    col = f"{alias}." if alias else ""
    return (f"{col}answered_at IS NULL "
            f"AND {col}claimed_at > clock_timestamp() - make_interval(secs => {window})")
