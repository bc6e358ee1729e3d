"""The S3 backend (aiobotocore): objects live in one bucket under one key prefix; S3 signs its own URLs.

Credentials, endpoint and region come from the usual AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, AWS_REGION / AWS_DEFAULT_REGION), a profile or a workload identity,
all read by botocore itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import botocore.session
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from vidjobs.storage import integrity
from vidjobs.storage.base import (
    MalformedAnswer,
    ObjectInfo,
    ObjectMismatch,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
    StoredDigest,
)

log = logging.getLogger("vidjobs.storage")

MIN_PART_BYTES = 5 * 1024 * 1024  # S3 refuses smaller parts, except the last
MAX_PARTS = 10_000  # S3's limit per multipart upload
DELETE_BATCH = 1000  # S3's limit per DeleteObjects call, and a listing's page size
UNKNOWN_TYPE = "application/octet-stream"  # what a listing says: it does not carry content types
CHECKSUM = "SHA256"  # every object is stored with S3's own SHA-256 of it, which a HEAD reads back
PING_KEY = "readiness-probe"  # looked up, never written: any answer about it shows the store is answering
_MISSING = {"404", "NoSuchKey", "NotFound"}
# Codes S3-compatible stores send for "try again": treated like a 5xx, as an outage of the store.
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable",
              "InternalError"}


@dataclass(frozen=True)
class TimeLimits:
    """How long one request may wait on the store, and how many tries one call makes. A request that cannot
    connect, or hears nothing back, for `timeout_s` is abandoned: its connection is closed, not reused."""

    timeout_s: float = 3.0
    attempts: int = 2

    def call_s(self, body_bytes: int = 0) -> float:
        """The bound on one call as a whole, its tries included. botocore's per-request limits do not cover
        every wait (a PUT waiting on `100 Continue` from a stalled store hears no read timeout), so this does.
        A body gets time to travel at MIN_SEND_RATE on top."""
        return self.attempts * self.timeout_s + body_bytes / MIN_SEND_RATE


DEFAULT_LIMITS = TimeLimits()
MIN_SEND_RATE = 1024 * 1024  # bytes a second: a store slower than this at taking a body counts as stalled


def _client_options(environ: Mapping[str, str], limits: TimeLimits) -> dict[str, Any]:
    """Options shared by the async client and the presigner."""
    s3: dict[str, Any] = {}
    # A store of our own (MinIO, a loopback test server) rarely serves bucket-named hosts: address by path.
    if environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL"):
        s3["addressing_style"] = "path"
    return {
        "s3": s3, "signature_version": "s3v4", "connect_timeout": limits.timeout_s, "read_timeout": limits.timeout_s,
        "retries": {"mode": "standard", "max_attempts": limits.attempts},
    }


def _region(environ: Mapping[str, str]) -> str | None:
    # botocore reads AWS_DEFAULT_REGION but not AWS_REGION, which most deployments (and ours) set.
    return environ.get("AWS_REGION") or None


def _read_part(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as source:
        source.seek(offset)
        return source.read(size)


@contextlib.asynccontextmanager
async def _bounded(action: str, key: str, seconds: float) -> AsyncIterator[None]:
    """One call, within `seconds` and in our taxonomy: a store that does not answer in time is unavailable
    (the request in flight is cancelled, which closes its connection)."""
    try:
        async with asyncio.timeout(seconds):
            with _translated(action, key):
                yield
    except TimeoutError as exc:
        raise StorageUnavailable(f"S3 did not answer within {seconds:.0f} s to {action} {key!r}") from exc


@contextlib.contextmanager
def _translated(action: str, key: str) -> Iterator[None]:
    """The one place where botocore and aiohttp failures become StorageError."""
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            raise ObjectNotFound(key) from exc
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        kind = StorageUnavailable if status >= 500 or code in _THROTTLED else StorageError
        raise kind(f"S3 could not {action} {key!r}: {code or exc}") from exc
    except (BotoCoreError, aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise StorageUnavailable(f"S3 could not {action} {key!r}: {exc}") from exc


def _field(answer: Mapping[str, Any], name: str, action: str, key: str) -> Any:
    """A field every answer of its kind carries. botocore leaves out what the store did not send (a HEAD without
    Content-Length has no ContentLength): that is the store misbehaving, never a bug of ours, so it is raised
    as the store being unavailable rather than as a KeyError."""
    try:
        return answer[name]
    except KeyError:
        raise MalformedAnswer(f"S3's answer to {action} {key!r} had no {name}") from None


class S3Storage:
    def __init__(self, bucket: str, prefix: str = "", *, part_bytes: int = 8 * 1024 * 1024,
                 environ: Mapping[str, str] | None = None, limits: TimeLimits = DEFAULT_LIMITS):
        environ = os.environ if environ is None else environ
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._part_bytes = max(part_bytes, MIN_PART_BYTES)
        self._region = _region(environ)
        self.limits = limits
        self._options = _client_options(environ, limits)
        self._session = get_session()
        self._opening = asyncio.Lock()
        self._clients: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        # Presigning is a local computation, and the gateway does it while rendering a job, synchronously:
        # a plain botocore client does it without an event loop and never touches the network for it.
        self._presigner: BaseClient = botocore.session.get_session().create_client(
            "s3", region_name=self._region, config=Config(**self._options))

    def full_key(self, key: str) -> str:
        """The bucket key behind one of our keys; refuses what a URL would rewrite (`.` and `..` segments) and a
        leading slash, as the filesystem backend refuses keys that climb out of its root."""
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in {".", ".."} for p in parts):
            raise StorageError(f"object key not allowed: {key!r}")
        return self.prefix + key

    async def client(self) -> Any:
        """The aiobotocore client, opened on first use (so the factory stays synchronous)."""
        async with self._opening:
            if self._client is None:
                clients = contextlib.AsyncExitStack()
                self._client = await clients.enter_async_context(self._session.create_client(
                    "s3", region_name=self._region, config=AioConfig(**self._options)))
                self._clients = clients
            return self._client

    async def close(self) -> None:
        clients, self._clients, self._client = self._clients, None, None
        if clients is not None:
            await clients.aclose()
        self._presigner.close()

    async def put_bytes(self, key: str, data: bytes, content_type: str) -> ObjectInfo:
        async with _bounded("store", key, self.limits.call_s(len(data))):
            s3 = await self.client()
            await s3.put_object(Bucket=self.bucket, Key=self.full_key(key), Body=data, ContentType=content_type,
                                ChecksumAlgorithm=CHECKSUM)
        return ObjectInfo(key=key, bytes=len(data), content_type=content_type)

    async def put_file(self, key: str, path: Path, content_type: str) -> ObjectInfo:
        size = (await asyncio.to_thread(path.stat)).st_size
        if not self._multipart(path, size):
            return await self.put_bytes(key, await asyncio.to_thread(path.read_bytes), content_type)
        with _translated("store", key):  # each request of it is bounded on its own
            stored = await self._put_multipart(key, path, size, content_type)
        return ObjectInfo(key=key, bytes=stored, content_type=content_type)

    async def _put_multipart(self, key: str, path: Path, size: int, content_type: str) -> int:
        """Streams the file one part at a time, so memory holds one part whatever the file's size."""
        s3, full = await self.client(), self.full_key(key)
        part_bytes = self._part_size(size)
        async with _bounded("store", key, self.limits.call_s()):
            upload = await s3.create_multipart_upload(Bucket=self.bucket, Key=full, ContentType=content_type,
                                                      ChecksumAlgorithm=CHECKSUM)
        upload_id = _field(upload, "UploadId", "start storing", key)
        try:
            parts: list[dict[str, str | int]] = []
            offset = 0
            while chunk := await asyncio.to_thread(_read_part, path, offset, part_bytes):
                number = len(parts) + 1
                async with _bounded("store", key, self.limits.call_s(len(chunk))):
                    sent = await s3.upload_part(Bucket=self.bucket, Key=full, UploadId=upload_id,
                                                PartNumber=number, Body=chunk, ChecksumAlgorithm=CHECKSUM)
                # S3 completes an upload made with a checksum only when each part names its own.
                parts.append({"ETag": _field(sent, "ETag", "store a part of", key), "PartNumber": number,
                              "ChecksumSHA256": _field(sent, "ChecksumSHA256", "store a part of", key)})
                offset += len(chunk)
            async with _bounded("store", key, self.limits.call_s()):
                await s3.complete_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id,
                                                   MultipartUpload={"Parts": parts})
        except BaseException:
            # Also on cancellation: an unfinished upload's parts are billed until someone aborts it.
            await self._abort(s3, full, upload_id)
            raise
        return offset

    def _part_size(self, size: int) -> int:
        """The part size a file of `size` bytes is uploaded in: the configured one, or larger where the file
        would otherwise need more than S3's MAX_PARTS."""
        return max(self._part_bytes, -(-size // MAX_PARTS))

    def _multipart(self, source: Path | bytes, size: int) -> bool:
        return isinstance(source, Path) and size >= self._part_bytes

    async def _abort(self, s3: Any, full_key: str, upload_id: str) -> None:
        try:
            async with asyncio.timeout(self.limits.call_s()):
                await s3.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
        except (BotoCoreError, ClientError, aiohttp.ClientError, TimeoutError):
            # The first failure is the one worth raising; a bucket lifecycle rule reaps what is left.
            log.warning("could not abort multipart upload", extra={"key": full_key, "upload_id": upload_id},
                        exc_info=True)

    async def get_bytes(self, key: str) -> bytes:
        # What we read back is small (an input image), so the same bound as a small call does.
        async with _bounded("read", key, self.limits.call_s()):
            s3 = await self.client()
            answer = await s3.get_object(Bucket=self.bucket, Key=self.full_key(key))
            async with _field(answer, "Body", "read", key) as body:
                data: bytes = await body.read()
                return data

    async def read_chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        # Each chunk is bounded on its own: a long object takes as long as it takes, a stalled store does not.
        async with _bounded("read", key, self.limits.call_s()):
            s3 = await self.client()
            answer = await s3.get_object(Bucket=self.bucket, Key=self.full_key(key))
        async with _field(answer, "Body", "read", key) as body:
            while True:
                async with _bounded("read", key, self.limits.call_s(chunk_bytes)):
                    chunk: bytes = await body.read(chunk_bytes)
                if not chunk:
                    return
                yield chunk

    async def head(self, key: str) -> ObjectInfo:
        async with _bounded("look up", key, self.limits.call_s()):
            s3 = await self.client()
            meta = await s3.head_object(Bucket=self.bucket, Key=self.full_key(key))
        return ObjectInfo(key=key, bytes=_field(meta, "ContentLength", "look up", key),
                          content_type=meta.get("ContentType", UNKNOWN_TYPE),
                          modified_at=_field(meta, "LastModified", "look up", key).timestamp())

    async def digest(self, key: str) -> StoredDigest:
        async with _bounded("look up", key, self.limits.call_s()):
            s3 = await self.client()
            meta = await s3.head_object(Bucket=self.bucket, Key=self.full_key(key), ChecksumMode="ENABLED")
        checksum = meta.get("ChecksumSHA256")
        if not checksum:
            raise ObjectMismatch(f"S3 keeps no SHA-256 for {key!r}: it was not stored with one")
        sha256, parts = integrity.hex_of(checksum, key)
        return StoredDigest(key=key, bytes=_field(meta, "ContentLength", "look up", key), sha256=sha256, parts=parts)

    async def verify(self, key: str, source: Path | bytes, sha256: str) -> StoredDigest:
        """S3 checked each body against the SHA-256 sent with it and reports what it kept. An object put whole
        carries the hash of the whole, compared with `sha256` as it is; one put in parts carries the hash of
        its parts' hashes, so the source is read once more to compute it (and its whole hash, which proves
        the parts were the bytes the caller hashed)."""
        found = await self.digest(key)
        size = len(source) if isinstance(source, bytes) else (await asyncio.to_thread(source.stat)).st_size
        if not self._multipart(source, size):
            integrity.require(found, size=size, sha256=sha256)
            return found
        layout = await asyncio.to_thread(integrity.layout_of, source, self._part_size(size))
        integrity.require_source(layout, sha256, key)
        composite, parts = layout.composite()
        if found.parts not in (0, parts):
            raise ObjectMismatch(f"S3 holds {key!r} in {found.parts} parts; it was sent in {parts}")
        integrity.require(found, size=size, sha256=composite, what="composite SHA-256")
        return found

    async def delete(self, key: str) -> None:
        async with _bounded("delete", key, self.limits.call_s()):
            s3 = await self.client()
            await s3.delete_object(Bucket=self.bucket, Key=self.full_key(key))

    async def list_prefix(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        token: str | None = None
        while True:
            page = await self._list_page(prefix, token)
            for item in page.get("Contents", []):
                yield ObjectInfo(key=_field(item, "Key", "list", prefix).removeprefix(self.prefix),
                                 bytes=_field(item, "Size", "list", prefix), content_type=UNKNOWN_TYPE,
                                 modified_at=_field(item, "LastModified", "list", prefix).timestamp())
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    async def _list_page(self, prefix: str, token: str | None = None) -> dict[str, Any]:
        """One page of a listing, bounded on its own (never across the caller's work between pages)."""
        more = {"ContinuationToken": token} if token else {}
        async with _bounded("list", prefix, self.limits.call_s()):
            s3 = await self.client()
            try:
                page: dict[str, Any] = await s3.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + prefix,
                                                                MaxKeys=DELETE_BATCH, **more)
            except KeyError as exc:
                # botocore URL-decodes every listed key as it parses the page, and an entry without one
                # raises there, before `_field` could look: the store misbehaving, as much as a missing field.
                raise MalformedAnswer(f"S3's answer to list {prefix!r} had an entry without {exc.args[0]}") from None
        return page

    async def delete_prefix(self, prefix: str) -> int:
        """Lists the first page, deletes it, and starts over until nothing is left: this never relies on a
        continuation token staying valid while the objects it points past are removed."""
        removed, previous = 0, None
        while True:
            page = await self._list_page(prefix)
            keys = [_field(item, "Key", "list", prefix) for item in page.get("Contents", [])]
            if not keys:
                return removed
            if keys == previous:
                raise StorageError(f"S3 still lists {len(keys)} objects under {prefix!r} after deleting them")
            async with _bounded("delete under", prefix, self.limits.call_s()):
                await self._delete_batch(await self.client(), keys)
            removed, previous = removed + len(keys), keys

    async def _delete_batch(self, s3: Any, keys: list[str]) -> None:
        answer = await s3.delete_objects(
            Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
        if errors := answer.get("Errors"):
            first = errors[0]
            raise StorageError(f"S3 refused to delete {len(errors)} objects, e.g. {first.get('Key')!r}: "
                               f"{first.get('Code')} {first.get('Message')}")

    async def ping(self) -> None:
        # Any answer shows the store is there: a missing object (404), or a 403 where the role may not list.
        try:
            async with _bounded("look up", PING_KEY, self.limits.timeout_s):  # one try: a probe is asked again
                s3 = await self.client()
                await s3.head_object(Bucket=self.bucket, Key=self.full_key(PING_KEY))
        except StorageUnavailable:
            raise
        except StorageError:  # ObjectNotFound among them
            return

    def signed_url(self, key: str, ttl_s: int) -> tuple[str, float]:
        # The clock is read before signing, so the URL's own X-Amz-Date is this second or later: the link
        # lives at least until the expiry we report.
        expires = float(int(time.time()) + ttl_s)
        with _translated("sign", key):
            # botocore attaches generate_presigned_url to every client class at runtime; its stub's BaseClient
            # leaves it out.
            url: str = self._presigner.generate_presigned_url(  # type: ignore[attr-defined]
                "get_object", Params={"Bucket": self.bucket, "Key": self.full_key(key)}, ExpiresIn=ttl_s)
        return url, expires
