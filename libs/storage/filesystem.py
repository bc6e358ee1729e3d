"""The filesystem backend: objects are files under one root; the gateway serves them by signed URL."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path

from libs.storage import signing
from libs.storage.base import ObjectInfo, ObjectNotFound, StorageError


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
                shutil.copyfile(source, tmp)
                with open(tmp, "rb+") as out:
                    os.fsync(out.fileno())
            self._content_type_path(path).write_text(content_type)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return ObjectInfo(key=key, bytes=path.stat().st_size, content_type=content_type)

    async def put_file(self, key: str, path: Path, content_type: str) -> ObjectInfo:
        return await asyncio.to_thread(self._write, key, path, content_type)

    async def put_bytes(self, key: str, data: bytes, content_type: str) -> ObjectInfo:
        return await asyncio.to_thread(self._write, key, data, content_type)

    async def get_bytes(self, key: str) -> bytes:
        try:
            return await asyncio.to_thread(self.path_for(key).read_bytes)
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    async def head(self, key: str) -> ObjectInfo:
        path = self.path_for(key)
        try:
            size = path.stat().st_size
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        return ObjectInfo(key=key, bytes=size, content_type=self.content_type(key))

    def content_type(self, key: str) -> str:
        try:
            return self._content_type_path(self.path_for(key)).read_text()
        except FileNotFoundError:
            return "application/octet-stream"

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

    def signed_url(self, key: str, ttl_s: int) -> tuple[str, float]:
        return signing.sign(self._base_url, self._secret, key, ttl_s)

    async def close(self) -> None:
        return None
