"""Stream a provider's output into a local file, measuring and hashing it on the way.

Memory stays flat whatever the size: the body is read in chunks, each written and hashed off the event loop,
and the byte cap is enforced while reading, not after. Every failure becomes `MediaError(DOWNLOAD_FAILED)`
with a message that says what went wrong, so the caller only has to decide between retrying and giving up;
a URL refused as unsafe is marked final, because asking again would be refused again.

How long a download may take is paced, not fixed: a provider that sends nothing for `stall_s` is given up at
once, and one that keeps sending may take as long as the render's size at `min_bytes_per_s` (its declared
length, else the byte cap), even past the caller's time cap, which only ever lengthens this way: a 500 MB
render at 1 MB/s is not cut off at a stage deadline meant for a few MB, nor does a trickle hold its copy slot
for ever. When the allowance runs past the caller's cap, the pace's `extend` is told first, so the job's own
deadline moves with it.

Redirects are followed here, hop by hop, never by aiohttp: each hop is screened again, and on the guarded
session of netguard.py its scheme, host and addresses are checked again before anything is sent to it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
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
MIN_BYTES_PER_S = 250_000.0
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class Fetched(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    bytes: int
    sha256: str


class Pace(msgspec.Struct, frozen=True, kw_only=True):
    """How slow a download may be: silent at most `stall_s` at a time, and on average no slower than
    `min_bytes_per_s` over the whole render. `extend(seconds)` is awaited when the render's size gives the
    download more time than the caller's cap: it has `seconds` more from now."""

    stall_s: float = SOCK_READ_S
    min_bytes_per_s: float = MIN_BYTES_PER_S
    extend: Callable[[float], Awaitable[None]] | None = None


# The media worker sets its pace (its settings and its job's deadline) for the download its task runs; the
# copier in between only passes a time cap along.
# Unset: the defaults (a Pace is frozen, but ruff cannot know that of a default).
PACE: ContextVar[Pace | None] = ContextVar("download_pace", default=None)


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
    """Download `url` into `dest` within `max_bytes` bytes, in `timeout_s` seconds or as long as PACE allows
    for its size, whichever is longer."""
    pace, loop = PACE.get() or Pace(), asyncio.get_running_loop()
    started, allowed_s = loop.time(), timeout_s
    try:
        async with asyncio.timeout(timeout_s) as cap:
            async with _get(session, url, headers, pace) as resp:
                _check_response(resp, max_bytes)
                allowed_s = max(timeout_s, (resp.content_length or max_bytes) / pace.min_bytes_per_s)
                if allowed_s > timeout_s:
                    cap.reschedule(started + allowed_s)
                    if pace.extend is not None:
                        await pace.extend(started + allowed_s - loop.time())
                fetched = await _stream(resp, dest, max_bytes)
    except aiohttp.ServerTimeoutError as exc:  # before TimeoutError: it is one, but says the peer fell silent
        raise _failed(f"The provider sent nothing for {pace.stall_s:.0f} s while we fetched the finished render."
                      ) from exc
    except TimeoutError as exc:
        raise _failed(f"Fetching the finished render from the provider took longer than {allowed_s:.0f} s.") \
            from exc
    except aiohttp.ClientResponseError as exc:
        raise _failed(f"The provider answered HTTP {exc.status} when we fetched the finished render.") from exc
    except aiohttp.ClientError as exc:
        raise _failed(f"The connection to the provider failed while fetching the render ({type(exc).__name__}).") \
            from exc
    media_metrics.DOWNLOAD_SECONDS.observe(loop.time() - started)
    media_metrics.DOWNLOAD_BYTES.inc(fetched.bytes)
    return fetched


@asynccontextmanager
async def _get(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
               pace: Pace) -> AsyncIterator[aiohttp.ClientResponse]:
    """GET `url`, following at most MAX_REDIRECTS redirects. The provider's headers go only to the origin
    they were meant for: a redirect elsewhere must not carry its key."""
    target, sent = netguard.screen_url(url), dict(headers)
    # The overall time cap is fetch_to_file's; these only bound connecting and a silent peer, per request.
    per_request = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S, sock_read=pace.stall_s)
    for _ in range(MAX_REDIRECTS + 1):
        async with session.get(target, headers=sent, timeout=per_request, allow_redirects=False) as resp:
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
