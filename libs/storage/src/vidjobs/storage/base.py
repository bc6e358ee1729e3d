"""The object-storage protocol. Keys are derived by us from account and job, never from client input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from vidjobs.common.errors import PartUnavailable


class ObjectInfo(msgspec.Struct, kw_only=True):
    key: str
    bytes: int
    content_type: str
    modified_at: float | None = None  # unix seconds, where the backend knows it (listings always do)


class StorageError(Exception):
    """An object could not be stored, read or removed."""


class ObjectNotFound(StorageError):
    pass


class StorageUnavailable(StorageError, PartUnavailable):
    """The store could not be reached or answered with a server error: the same call may succeed later."""


class MalformedAnswer(StorageUnavailable):
    """The store answered, but without what every answer of its kind carries (an object's size or time, a
    listed object's key): an S3-compatible store, or an HTTP front before it, that misbehaves. Nothing about
    the object or the work; the same call succeeds once the store answers whole again."""


class ObjectMismatch(StorageUnavailable):
    """The object the store holds is not the bytes we stored (its size or SHA-256 differs): a fault of the
    store, not of the work, so storing the same bytes again may succeed."""


class StoredDigest(msgspec.Struct, frozen=True, kw_only=True):
    """An object's size and SHA-256 as the store itself reports them (never as we computed them on sending).

    An S3 object uploaded in N parts carries the hash of its parts' hashes instead of the whole's (S3's
    "composite" checksum); `parts` is N where the store says so, else 0 (moto, for one, leaves the count
    out): only the backend that uploaded the object knows its part layout, which is why `verify` is its own."""

    key: str
    bytes: int
    sha256: str  # lowercase hex
    parts: int = 0


@runtime_checkable
class Storage(Protocol):
    async def put_file(self, key: str, path: Path, content_type: str) -> ObjectInfo:
        """Store a local file under `key`, replacing any object there (so a retry is harmless). The file must
        be finished: it may be removed afterwards but not written again (the filesystem backend may keep it
        under a second name rather than copy it)."""

    async def put_bytes(self, key: str, data: bytes, content_type: str) -> ObjectInfo: ...

    async def get_bytes(self, key: str) -> bytes: ...

    def read_chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The object's bytes in chunks of at most `chunk_bytes`, read as they are asked for, so memory holds
        one chunk whatever the object's size. Raises ObjectNotFound (at the first chunk)."""

    async def head(self, key: str) -> ObjectInfo:
        """Raises ObjectNotFound."""

    async def digest(self, key: str) -> StoredDigest:
        """The object's size and SHA-256 as the store holds them: S3 answers them to a HEAD, the filesystem
        backend stats and hashes the stored file. Raises ObjectNotFound; ObjectMismatch when the store keeps
        no SHA-256 for the object (it was not stored through us)."""

    async def verify(self, key: str, source: Path | bytes, sha256: str) -> StoredDigest:
        """Prove the object under `key` holds exactly the bytes of `source`, whose SHA-256 (hex) the caller
        took before storing them (a download hashes as it writes): checks the size and the hash the store
        reports. Raises ObjectMismatch otherwise, and also when `source` itself no longer hashes to `sha256`."""

    async def delete(self, key: str) -> None:
        """Remove an object; a missing object is not an error."""

    async def delete_prefix(self, prefix: str) -> int:
        """Remove every object under `prefix`; returns how many."""

    def list_prefix(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object under `prefix`, in pages, with its size and modification time (for sweeps)."""

    def signed_url(self, key: str, ttl_s: int) -> tuple[str, float]:
        """A URL that reads this one object until the returned expiry (unix seconds)."""

    async def ping(self) -> None:
        """Raises StorageUnavailable unless the store answers (whatever it answers) within its time limit: what
        a readiness probe asks."""

    async def close(self) -> None: ...


def account_prefix(account_id: str) -> str:
    """Everything stored for one account (its jobs' renders and its uploads) lies under this prefix."""
    return f"accounts/{account_id}/"


def job_prefix(account_id: str, job_id: str) -> str:
    return f"accounts/{account_id}/jobs/{job_id}/"


def upload_prefix(account_id: str, upload_id: str) -> str:
    return f"accounts/{account_id}/uploads/{upload_id}/"


QUARANTINE_NAME = "quarantine"


def quarantine_key(account_id: str, upload_id: str) -> str:
    """Where an upload's raw bytes wait until the media worker has decoded them. Never signed for anyone:
    only the cleaned image, under the upload's own key, is ever handed out."""
    return upload_prefix(account_id, upload_id) + QUARANTINE_NAME
