"""A storage wrapper for tests: right after some stores, the object that landed is replaced, through the real
store, by the same bytes with one of them flipped, as a store that mangles what it keeps would leave it. The
caller's verification must then catch it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from vidjobs.storage.base import ObjectInfo, Storage, StoredDigest


def flipped(data: bytes) -> bytes:
    """The same bytes, the middle one inverted: same size, another SHA-256."""
    out = bytearray(data)
    out[len(out) // 2] ^= 0xFF
    return bytes(out)


class CorruptingStorage:
    """Corrupts the first `times` stores of each key ending with one of `names` (every key when empty)."""

    def __init__(self, inner: Storage, *, times: int, names: tuple[str, ...] = ()):
        self.inner = inner
        self.times = times
        self.names = names
        self.corrupted: list[str] = []  # keys, once per corruption

    async def _after_store(self, key: str, content_type: str) -> None:
        if self.names and not key.endswith(self.names):
            return
        if self.corrupted.count(key) >= self.times:
            return
        self.corrupted.append(key)
        await self.inner.put_bytes(key, flipped(await self.inner.get_bytes(key)), content_type)

    async def put_file(self, key: str, path: Path, content_type: str) -> ObjectInfo:
        stored = await self.inner.put_file(key, path, content_type)
        await self._after_store(key, content_type)
        return stored

    async def put_bytes(self, key: str, data: bytes, content_type: str) -> ObjectInfo:
        stored = await self.inner.put_bytes(key, data, content_type)
        await self._after_store(key, content_type)
        return stored

    async def get_bytes(self, key: str) -> bytes:
        return await self.inner.get_bytes(key)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def digest(self, key: str) -> StoredDigest:
        return await self.inner.digest(key)

    async def verify(self, key: str, source: Path | bytes, sha256: str) -> StoredDigest:
        return await self.inner.verify(key, source, sha256)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def delete_prefix(self, prefix: str) -> int:
        return await self.inner.delete_prefix(prefix)

    def list_prefix(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        return self.inner.list_prefix(prefix)

    def signed_url(self, key: str, ttl_s: int) -> tuple[str, float]:
        return self.inner.signed_url(key, ttl_s)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()
