"""Proof that a store kept what we sent. After every store, the object's size and SHA-256 as the store itself
reports them are compared with the bytes we meant to store; an object that differs is stored again, a few
times at most, and then the caller hears ObjectMismatch (a retryable storage fault)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from pathlib import Path

from vidjobs.storage.base import ObjectInfo, ObjectMismatch, Storage, StoredDigest

log = logging.getLogger("vidjobs.storage")

READ_CHUNK = 1024 * 1024  # bytes hashed per read of a local file
DEFAULT_ATTEMPTS = 3  # stores of one object before its mismatch is the caller's


class Layout:
    """The hashes a store would report for some bytes: of the whole, and of its parts' hashes (S3's
    composite checksum of an object uploaded in parts of `part_bytes`)."""

    def __init__(self, part_bytes: int | None = None):
        self.part_bytes = part_bytes
        self.whole = hashlib.sha256()
        self.size = 0
        self.parts: list[bytes] = []
        self._part = hashlib.sha256()
        self._in_part = 0

    def update(self, data: bytes) -> None:
        self.whole.update(data)
        self.size += len(data)
        if self.part_bytes is None:
            return
        view = memoryview(data)
        while view:
            take = min(len(view), self.part_bytes - self._in_part)
            self._part.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == self.part_bytes:
                self._close_part()

    def _close_part(self) -> None:
        self.parts.append(self._part.digest())
        self._part, self._in_part = hashlib.sha256(), 0

    def composite(self) -> tuple[str, int]:
        """The composite hash (hex) and how many parts it covers."""
        if self._in_part:
            self._close_part()
        return hashlib.sha256(b"".join(self.parts)).hexdigest(), len(self.parts)


def layout_of(source: Path | bytes, part_bytes: int | None = None) -> Layout:
    """Hash `source` as a store would (blocking: a file is read once, a chunk at a time)."""
    layout = Layout(part_bytes)
    if isinstance(source, bytes):
        layout.update(source)
        return layout
    with open(source, "rb") as file:
        while chunk := file.read(READ_CHUNK):
            layout.update(chunk)
    return layout


def hex_of(checksum: str, key: str) -> tuple[str, int]:
    """S3's base64 checksum (`<base64>` or `<base64>-<parts>`) as hex, with its part count (0: none said)."""
    encoded, _, count = checksum.partition("-")
    try:
        return base64.b64decode(encoded, validate=True).hex(), int(count or 0)
    except (binascii.Error, ValueError) as exc:
        raise ObjectMismatch(f"the store reports an unreadable SHA-256 {checksum!r} for {key!r}") from exc


def require(found: StoredDigest, *, size: int, sha256: str, what: str = "SHA-256") -> None:
    """Raises ObjectMismatch unless the store's size and hash are the ones expected."""
    if found.bytes != size:
        raise ObjectMismatch(f"the store holds {found.bytes} bytes under {found.key!r}; {size} were sent")
    if found.sha256 != sha256:
        raise ObjectMismatch(f"the object under {found.key!r} has {what} {found.sha256[:16]}..., "
                             f"not the {sha256[:16]}... of the bytes sent")


def require_source(layout: Layout, sha256: str, key: str) -> None:
    """The local bytes are still the ones the caller hashed first (a scratch file can rot on its disk too)."""
    if layout.whole.hexdigest() != sha256:
        raise ObjectMismatch(f"the local copy stored under {key!r} no longer has the SHA-256 it was fetched with")


async def put_verified(storage: Storage, key: str, source: Path | bytes, content_type: str, *, sha256: str,
                       attempts: int = DEFAULT_ATTEMPTS) -> ObjectInfo:
    """Store `source` under `key` and prove the store kept it; an object that differs is stored again, up to
    `attempts` stores in all. Raises ObjectMismatch when every one differed (as well as what a store raises)."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    for attempt in range(1, attempts + 1):
        if isinstance(source, bytes):
            stored = await storage.put_bytes(key, source, content_type)
        else:
            stored = await storage.put_file(key, source, content_type)
        try:
            await storage.verify(key, source, sha256)
            return stored
        except ObjectMismatch as exc:
            if attempt == attempts:
                raise ObjectMismatch(f"{exc} (after {attempts} stores)") from exc
            log.warning("the stored object differs from what was sent; storing it again",
                        extra={"key": key, "attempt": attempt, "error": str(exc)})
    raise AssertionError("unreachable: the last attempt returns or raises")
