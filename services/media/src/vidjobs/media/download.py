"""Stream a provider's output into a local file, measuring and hashing it on the way.

Memory stays flat whatever the size: the body is read in chunks, each written and hashed off the event loop,
and the byte cap is enforced while reading, not after. Every failure becomes `MediaError(DOWNLOAD_FAILED)`
with a message that says what went wrong, so the caller only has to decide between retrying and giving up;
a URL refused as unsafe is marked final, because asking again would be refused again.

Redirects are followed here, hop by hop, never by aiohttp: each hop is screened again, and on the guarded
session of netguard.py its scheme, host and addresses are checked again before anything is sent to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import aiohttp
import msgspec
from yarl import URL

from vidjobs.common import netguard
from vidjobs.common.errors import ErrorCode, MediaError
from vidjobs.media import media_metrics

CHUNK_BYTES = 1 << 20
# A provider that stops sending for this long is stuck, whatever the overall time cap still allows.
SOCK_READ_S = 30.0
CONNECT_S = 10.0
# The overall time cap is the caller's; these only bound connecting and a silent peer, per request.
PER_REQUEST = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S, sock_read=SOCK_READ_S)
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class Fetched(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    bytes: int
    sha256: str


class _Sink:
    """A file being written and hashed; its methods block, so callers run them in a thread."""

    def __init__(self, path: Path):
        self._file: BinaryIO = open(path, "wb")
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self.digest.update(chunk)
        self.size += len(chunk)

    def close(self) -> None:
        self._file.close()


def _failed(message: str) -> MediaError:
    return MediaError(ErrorCode.DOWNLOAD_FAILED, message)


def check_url(url: str | None) -> str:
    """Only plain web URLs are fetched; anything else would never succeed on a retry either."""
    if not url:
        raise netguard.refused("The provider reported a finished render without a download address.")
    netguard.screen_url(url)
    return url


async def fetch_to_file(
    session: aiohttp.ClientSession, url: str, dest: Path, *, headers: Mapping[str, str], max_bytes: int,
    timeout_s: float,
) -> Fetched:
    """Download `url` into `dest` within `timeout_s` seconds and `max_bytes` bytes."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with _get(session, url, headers) as resp:
                _check_response(resp, max_bytes)
                fetched = await _stream(resp, dest, max_bytes)
    except TimeoutError as exc:
        raise _failed(f"Fetching the finished render from the provider took longer than {timeout_s:.0f} s.") from exc
    except aiohttp.ClientResponseError as exc:
        raise _failed(f"The provider answered HTTP {exc.status} when we fetched the finished render.") from exc
    except aiohttp.ClientError as exc:
        raise _failed(f"The connection to the provider failed while fetching the render ({type(exc).__name__}).") \
            from exc
    media_metrics.DOWNLOAD_SECONDS.observe(time.perf_counter() - started)
    media_metrics.DOWNLOAD_BYTES.inc(fetched.bytes)
    return fetched


@asynccontextmanager
async def _get(session: aiohttp.ClientSession, url: str,
               headers: Mapping[str, str]) -> AsyncIterator[aiohttp.ClientResponse]:
    """GET `url`, following at most MAX_REDIRECTS redirects. The provider's headers go only to the origin
    they were meant for: a redirect elsewhere must not carry its key."""
    target, sent = netguard.screen_url(url), dict(headers)
    for _ in range(MAX_REDIRECTS + 1):
        async with session.get(target, headers=sent, timeout=PER_REQUEST, allow_redirects=False) as resp:
            if resp.status not in REDIRECTS:
                yield resp
                return
            following = _redirect_target(resp)
        if following.origin() != target.origin():
            sent = {}
        target = following
    raise netguard.refused(f"We refused to fetch the finished render: the provider's address redirected more "
                           f"than {MAX_REDIRECTS} times.")


def _redirect_target(resp: aiohttp.ClientResponse) -> URL:
    location = resp.headers.get(aiohttp.hdrs.LOCATION)
    if not location:
        raise _failed(f"The provider answered HTTP {resp.status} without saying where the render moved.")
    try:
        following = resp.url.join(URL(location))
    except ValueError as exc:
        raise netguard.refused("We refused to follow the provider's redirect: it named no valid address.") from exc
    return netguard.screen_url(following)


def _check_response(resp: aiohttp.ClientResponse, max_bytes: int) -> None:
    resp.raise_for_status()
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise _too_big(max_bytes)


def _too_big(max_bytes: int) -> MediaError:
    return _failed(f"The finished render is larger than the {max_bytes / 1e6:.0f} MB we accept.")


async def _stream(resp: aiohttp.ClientResponse, dest: Path, max_bytes: int) -> Fetched:
    sink = await asyncio.to_thread(_Sink, dest)
    try:
        async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
            if sink.size + len(chunk) > max_bytes:
                raise _too_big(max_bytes)
            await asyncio.to_thread(sink.write, chunk)
    finally:
        await asyncio.to_thread(sink.close)
    return Fetched(path=dest, bytes=sink.size, sha256=sink.digest.hexdigest())
