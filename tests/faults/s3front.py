"""An HTTP front for the S3 server: every request passed on to moto unchanged, until it is told to answer 500
or 503 instead (an object store that is up but failing, as S3 does under its own faults: `InternalError`,
`SlowDown`), which stopping moto's process cannot show, or to leave parts out of its answers: headers out of
its answers to HEAD (an S3-compatible store, or a proxy before it, that answers a HEAD without the object's
size or time) or of every answer (a part stored without its ETag), and XML elements out of answer bodies (a
listing without sizes, a multipart upload started without its id). The services
are given the front's address as their S3 endpoint; moto does not check signatures, so requests signed for the
front's host are served as they are.

Bodies are read whole before they are passed on: the suite's objects are small (tiny clips, thumbnails)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from tests.standins.server import serving

# S3's own error bodies, as botocore reads them (the code is what it retries on).
_ERRORS = {
    500: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
         b"<Message>We encountered an internal error. Please try again.</Message></Error>",
    503: b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
         b"<Message>Please reduce your request rate.</Message></Error>",
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class S3Front:
    def __init__(self, upstream: str):
        self.upstream = upstream
        self.failing: int | None = None  # 500 or 503 while failing; None passes requests on
        self.refused = 0  # requests answered with an error instead of passed on
        self.head_drops: frozenset[str] = frozenset()  # header names (lowercase) left out of answers to HEAD
        self.header_drops: frozenset[str] = frozenset()  # header names (lowercase) left out of every answer
        self.element_drops: re.Pattern[bytes] | None = None  # XML elements left out of answer bodies
        self.url = ""
        self._session: aiohttp.ClientSession | None = None

    def fail(self, status: int) -> None:
        assert status in _ERRORS, status
        self.failing = status

    def drop_from_heads(self, *headers: str) -> None:
        """Answers to HEAD leave these headers out (Content-Length, Last-Modified, ...), until mended."""
        self.head_drops = frozenset(h.lower() for h in headers)

    def drop_from_answers(self, *headers: str) -> None:
        """Every answer leaves these headers out (ETag, x-amz-checksum-sha256, ...), until mended."""
        self.header_drops = frozenset(h.lower() for h in headers)

    def drop_elements(self, *names: str) -> None:
        """Answer bodies leave these XML elements out, each with what it holds (Size, UploadId, ...), until
        mended. S3's answers hold no element nested in one of the same name."""
        alternatives = b"|".join(re.escape(n.encode()) for n in names)
        self.element_drops = re.compile(rb"<(" + alternatives + rb")>.*?</\1>", re.DOTALL)

    def mend(self) -> None:
        self.failing = None
        self.head_drops = self.header_drops = frozenset()
        self.element_drops = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.failing is not None:
            self.refused += 1
            return web.Response(status=self.failing, body=_ERRORS[self.failing], content_type="application/xml")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Host"] = request.host  # what the client signed
        body = await request.read()
        async with self._session.request(request.method, f"{self.upstream}{request.rel_url}", headers=headers,
                                         data=body, allow_redirects=False, auto_decompress=False) as upstream:
            head = request.method == "HEAD"
            drops = self.header_drops | (self.head_drops if head else frozenset())
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP | drops}
            payload = await upstream.read()
        if self.element_drops is not None:
            payload = self.element_drops.sub(b"", payload)
        answer = web.StreamResponse(status=upstream.status, headers=kept)
        if "content-length" not in drops:
            # A HEAD's Content-Length is the object's size, not its (empty) body's: botocore reads it. Left
            # unset on a HEAD, aiohttp sends none at all (a HEAD's answer has no body to frame).
            answer.content_length = int(upstream.headers.get("Content-Length", 0)) if head else len(payload)
        try:
            await answer.prepare(request)
            if request.method != "HEAD":
                await answer.write(payload)
            await answer.write_eof()
        except ConnectionResetError:
            pass  # the client gave up waiting (a stalled store): nobody is left to answer
        return answer

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[S3Front]:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            self._session = session
            async with serving(app) as url:
                self.url = url
                yield self
