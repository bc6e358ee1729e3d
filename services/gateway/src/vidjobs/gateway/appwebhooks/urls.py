"""Where webhooks may go: every URL passes the request-forgery guard of render downloads, at registration and
on every request (the delivering session is guarded too, when it connects)."""

from __future__ import annotations

from vidjobs.common import netguard
from vidjobs.gateway.apierrors import invalid

ALLOW_SETTING = "VIDJOBS_WEBHOOK_ALLOW_HOSTS"


class UnsafeEndpoint(ValueError):
    """A URL the request-forgery guard refuses; its message says why and what to do."""


# The endpoint's author reads its refusals: they never name the addresses a host resolved to.
WEBHOOKS = netguard.Purpose(doing="deliver webhooks", setting=ALLOW_SETTING, error=UnsafeEndpoint,
                            names_resolved=False)


def guard(settings_hosts: frozenset[str]) -> netguard.DownloadGuard:
    return netguard.DownloadGuard(settings_hosts, WEBHOOKS)


async def check_endpoint_url(url: str, hosts: frozenset[str]) -> None:
    """Raises UnsafeEndpoint unless the URL may be delivered to: its form, its literal address, and every
    address its name resolves to now (each delivery checks again, when it connects)."""
    await netguard.check_destination(url, guard(hosts))


async def checked_url(url: str, settings_hosts: frozenset[str], field: str) -> None:
    """check_endpoint_url as the API answers it: a 422 naming `field` and what to do."""
    try:
        await check_endpoint_url(url, settings_hosts)
    except UnsafeEndpoint as err:
        raise invalid(f"{field}: {err}") from err
