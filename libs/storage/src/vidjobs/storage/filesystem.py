"""The filesystem backend: objects are files under one root; the gateway serves them by signed URL."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from vidjobs.storage import integrity, signing
from vidjobs.storage.base import ObjectInfo, ObjectNotFound, StorageError, StorageUnavailable, StoredDigest

LIST_PAGE = 1000  # objects looked at per trip to a worker thread
PING_TIMEOUT_S = 2.0
UNKNOWN_TYPE = "application/octet-stream"  # what a listing says, as S3's does


# Content types a name's suffix implies, fixed here rather than read from the machine's mime.types.
_IMPLIED = {".mp4": "video/mp4", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png",
            ".webp": "image/webp"}


def _implied_type(name: str) -> str | None:
    return _IMPLIED.get(os.path.splitext(name)[1].lower())


def _link_or_copy(source: Path, target: Path) -> None:
    """A second name for the file where the filesystem allows it (the scratch file is finished and is only
    removed after), else a copy: a render is not read and written again just to move it a directory over."""
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, target)


def _is_object(name: str) -> bool:
    # Beside each object lie its content type, and while it is being written, a hidden temporary file.
    return not name.endswith(".content-type") and not (name.startswith(".") and name.endswith(".tmp"))


class FileStorage:
    def __init__(self, root: Path, *, base_url: str, secret: str):
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._base_url = base_url
        self._secret = secret

    def path_for(self, key: str) -> Path:
        """The file behind a key; refuses keys that would climb out of the root."""
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root) or path == self.root:
            raise StorageError(f"object key outside the storage root: {key!r}")
        return path

    def _content_type_path(self, path: Path) -> Path:
        return path.with_name(path.name + ".content-type")

    def _write(self, key: str, source: Path | bytes, content_type: str) -> ObjectInfo:
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write beside, fsync, then rename: a reader never sees half an object, a crash leaves none.
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            if isinstance(source, bytes):
                with open(tmp, "wb") as out:
                    out.write(source)
                    out.flush()
                    os.fsync(out.fileno())
            else:
                _link_or_copy(source, tmp)
                with open(tmp, "rb") as out:
                    os.fsync(out.fileno())
            self._record_content_type(path, content_type)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return ObjectInfo(key=key, bytes=path.stat().st_size, content_type=content_type)

    def _record_content_type(self, path: Path, content_type: str) -> None:
        """A content type its name implies needs no file beside it (and an older one beside it must go)."""
        side = self._content_type_path(path)
        if content_type == _implied_type(path.name):
            side.unlink(missing_ok=True)
        else:
            side.write_text(content_type)

    async def put_file(self, key: str, path: Path, content_type: str) -> ObjectInfo:
        return await asyncio.to_thread(self._write, key, path, content_type)

    async def put_bytes(self, key: str, data: bytes, content_type: str) -> ObjectInfo:
        return await asyncio.to_thread(self._write, key, data, content_type)

    async def get_bytes(self, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self.path_for(key).read_bytes)
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    async def read_chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        try:
            source = await asyncio.to_thread(open, self.path_for(key), "rb")
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        try:
            while chunk := await asyncio.to_thread(source.read, chunk_bytes):
                yield chunk
        finally:
            source.close()

    async def head(self, key: str) -> ObjectInfo:
        path = self.path_for(key)
        try:
            stat = path.stat()
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        return ObjectInfo(key=key, bytes=stat.st_size, content_type=self.content_type(key),
                          modified_at=stat.st_mtime)

    def _digest(self, key: str) -> StoredDigest:
        path = self.path_for(key)
        try:
            size = path.stat().st_size
            layout = integrity.layout_of(path)
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        return StoredDigest(key=key, bytes=size, sha256=layout.whole.hexdigest())

    async def digest(self, key: str) -> StoredDigest:
        """A stat and a hash of the stored file itself (which may share its inode with the source: then this
        proves the source, too, is still the bytes that were hashed when they arrived)."""
        return await asyncio.to_thread(self._digest, key)

    async def verify(self, key: str, source: Path | bytes, sha256: str) -> StoredDigest:
        found = await self.digest(key)
        size = len(source) if isinstance(source, bytes) else (await asyncio.to_thread(source.stat)).st_size
        integrity.require(found, size=size, sha256=sha256)
        return found

    def content_type(self, key: str) -> str:
        path = self.path_for(key)
        try:
            return self._content_type_path(path).read_text()
        except FileNotFoundError:
            return _implied_type(path.name) or UNKNOWN_TYPE

    async def delete(self, key: str) -> None:
        path = self.path_for(key)
        path.unlink(missing_ok=True)
        self._content_type_path(path).unlink(missing_ok=True)

    async def delete_prefix(self, prefix: str) -> int:
        base = self.path_for(prefix.rstrip("/"))
        if not base.exists():
            return 0
        count = sum(1 for p in base.rglob("*") if p.is_file() and not p.name.endswith(".content-type"))
        await asyncio.to_thread(shutil.rmtree, base, True)
        return count

    def _keys_under(self, prefix: str) -> list[str]:
        """Every object key starting with `prefix`, sorted as S3 lists them."""
        folder, _, _ = prefix.rpartition("/")
        base = self.path_for(folder) if folder else self.root
        keys = []
        for parent, _, names in os.walk(base):
            for name in filter(_is_object, names):
                key = (Path(parent) / name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def _describe(self, keys: list[str]) -> list[ObjectInfo]:
        found = []
        for key in keys:
            try:
                stat = self.path_for(key).stat()
            except FileNotFoundError:
                continue  # deleted since it was listed
            found.append(ObjectInfo(key=key, bytes=stat.st_size, content_type=UNKNOWN_TYPE,
                                    modified_at=stat.st_mtime))
        return found

    async def list_prefix(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        keys = await asyncio.to_thread(self._keys_under, prefix)
        for start in range(0, len(keys), LIST_PAGE):
            for info in await asyncio.to_thread(self._describe, keys[start:start + LIST_PAGE]):
                yield info

    def signed_url(self, key: str, ttl_s: int) -> tuple[str, float]:
        return signing.sign(self._base_url, self._secret, key, ttl_s)

    async def ping(self) -> None:
        # On a thread, bounded: a stalled disk (a hung network mount) blocks a stat, and only its thread waits.
        try:
            usable = await asyncio.wait_for(asyncio.to_thread(self.root.is_dir), PING_TIMEOUT_S)
        except TimeoutError as exc:
            raise StorageUnavailable(f"the storage root {self.root} did not answer within {PING_TIMEOUT_S:.0f} s") \
                from exc
        if not usable:
            raise StorageUnavailable(f"the storage root {self.root} is not a directory")

    async def close(self) -> None:
        return None
