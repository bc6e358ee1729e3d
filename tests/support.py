"""Helpers shared by tests."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at another database (keeps host, socket query and credentials)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
