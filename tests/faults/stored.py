"""The history checker's promises about the object store, read through the storage protocol (libs/storage), so
they hold for the filesystem and the S3 backend alike: a completed job's files are stored as recorded (4),
and nothing is stored that no row accounts for, beyond the time the orphan sweep may take (9)."""

from __future__ import annotations

import hashlib
import time

import asyncpg

from tests.faults.history import Violation
from tests.faults.snapshot import Snapshot
from vidjobs.common.settings import Settings
from vidjobs.storage.base import ObjectInfo, ObjectNotFound, Storage, quarantine_key

# The files each ending keeps: a completed job all three; an expired one its thumbnail (retention removed the
# rest). Deleted jobs keep none.
KEPT_FILES = {"completed": ("video", "thumbnail", "preview"), "expired": ("thumbnail",)}
CHUNK = 1 << 20
# Jobs that keep no object once ended; completed and expired ones keep what their live asset rows name.
KEEPS_NOTHING = frozenset({"failed", "canceled"})


async def read_whole(storage: Storage, key: str) -> tuple[int, str]:
    """(size, sha256) of the object as the store serves it: read back rather than asked, because an S3 object
    stored in parts reports a checksum of its parts, not of its bytes."""
    digest, size = hashlib.sha256(), 0
    async for chunk in storage.read_chunks(key, CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


# --- 4: a completed job's files (an expired one's thumbnail) are stored as recorded ------------------------

async def outputs_stored(storage: Storage, snap: Snapshot) -> list[Violation]:
    live = {(a.job_id, a.kind): a for a in snap.assets if not a.deleted}
    out = []
    for job in sorted(snap.jobs.values(), key=lambda j: j.id):
        for kind in () if job.deleted else KEPT_FILES.get(job.status, ()):
            asset = live.get((job.id, kind))
            why = f"no live {kind} recorded" if asset is None else await _differs(storage, asset.key, asset.bytes,
                                                                                   asset.sha256)
            if why:
                out.append(Violation("outputs_stored", job.id, f"{kind}: {why}"))
    return out


async def _differs(storage: Storage, key: str, size: int, sha256: str) -> str | None:
    try:
        stored_size, stored_sha = await read_whole(storage, key)
    except ObjectNotFound:
        return f"{key} is not in the store"
    if stored_size != size:
        return f"{key} holds {stored_size} bytes, {size} recorded"
    if sha256 and stored_sha != sha256:  # '' where a file older than its checksum column was recorded unknown
        return f"{key} has sha256 {stored_sha[:12]}..., {sha256[:12]}... recorded"
    return None


# --- 9: no orphan objects -----------------------------------------------------------------------------------

def sweep_allowance_s(settings: Settings) -> float:
    """How old an object nothing accounts for may be before the product promised it removed: the sweep never
    calls one younger than its grace an orphan, and runs once an interval."""
    return settings.orphan_grace_s + settings.orphan_sweep_interval_s


async def no_orphans(storage: Storage, database_url: str, settings: Settings) -> list[Violation]:
    objects = [info async for info in storage.list_prefix("accounts/")]
    owners = [_owner(info.key) for info in objects]
    conn = await asyncpg.connect(database_url)
    try:
        jobs = {r["id"]: r for r in await conn.fetch(
            "SELECT id, status::text AS status, deleted_at IS NOT NULL AS deleted FROM jobs WHERE id = ANY($1)",
            [o[1] for o in owners if o and o[0] == "jobs"])}
        kept = {r["key"] for r in await conn.fetch(
            "SELECT key FROM assets WHERE job_id = ANY($1) AND deleted_at IS NULL", list(jobs))}
        uploads = await conn.fetch("SELECT id, account_id, key, status FROM uploads WHERE deleted_at IS NULL "
                                   "AND id = ANY($1)", [o[1] for o in owners if o and o[0] == "uploads"])
    finally:
        await conn.close()
    kept |= {r["key"] for r in uploads} | {quarantine_key(r["account_id"], r["id"]) for r in uploads
                                           if r["status"] == "processing"}
    now, allowance = time.time(), sweep_allowance_s(settings)
    out = []
    for info, owner in zip(objects, owners, strict=True):
        why = _orphan(info, owner, jobs, kept, now - (info.modified_at or now) > allowance)
        if why:
            out.append(Violation("no_orphans", owner[1] if owner and owner[0] == "jobs" else None, why))
    return out


def _owner(key: str) -> tuple[str, str] | None:
    """`accounts/{account}/{jobs|uploads}/{id}/{name}` -> (jobs|uploads, id); None for any other layout."""
    parts = key.split("/")
    if len(parts) < 5 or parts[2] not in ("jobs", "uploads") or not parts[3]:
        return None
    return parts[2], parts[3]


def _orphan(info: ObjectInfo, owner: tuple[str, str] | None, jobs: dict[str, asyncpg.Record], kept: set[str],
            old: bool) -> str | None:
    if owner is None:
        return f"{info.key} is not a layout the product writes"
    kind, owner_id = owner
    if kind == "jobs" and owner_id not in jobs:
        # A job's row commits before anything is stored under its prefix: no age excuses this one.
        return f"{info.key} belongs to no job row"
    if info.key in kept or not old:
        return None
    if kind == "uploads":
        return f"{info.key} belongs to no live upload, past the orphan sweep's allowance"
    job = jobs[owner_id]
    if job["deleted"] or job["status"] in KEEPS_NOTHING or job["status"] in ("completed", "expired"):
        state = "deleted" if job["deleted"] else job["status"]
        return f"{info.key} of a {state} job is kept past the orphan sweep's allowance"
    return None  # a live job's objects: a copy may be writing them
