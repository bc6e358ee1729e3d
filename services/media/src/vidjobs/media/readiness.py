"""What media's /readyz says beyond the shared checks: every copy ends in the object store, so a store that
does not answer makes the worker unready for as long as it lasts (asked once per probe, within the store's
own time limit)."""

from __future__ import annotations

import logging

from vidjobs.storage.base import Storage, StorageUnavailable

log = logging.getLogger("vidjobs.media")


async def storage_problem(storage: Storage) -> str | None:
    try:
        await storage.ping()
    except StorageUnavailable as exc:
        log.warning("not ready: storage not answering", extra={"error": str(exc)})
        return "storage not answering"
    return None
