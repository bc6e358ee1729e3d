"""One local HTTP server that both a provider's official SDK and our adapter are pointed at: it records every
request as it came over the wire and answers each from a script, so the two can be compared call for call.

    async with recording() as server:
        server.answer("POST", r"/v1/text_to_video", 200, {"id": "task_1"})
        ...  # the SDK's call, then the adapter's, both at server.url
        sdk, ours = server.exchanges
        assert sdk.route == ours.route and sdk.json() == ours.json()

Unscripted requests get a 404 with a JSON error, and are recorded like the rest.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# Headers every HTTP client sets its own way; what they say is not the provider's protocol.
TRANSPORT_HEADERS = frozenset({"host", "content-length", "accept-encoding", "connection", "user-agent",
                               "transfer-encoding", "content-type", "accept"})


@dataclass(frozen=True)
class Exchange:
    """One request as the server received it."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]  # names lowercased
    body: bytes

    @property
    def route(self) -> tuple[str, str]:
        return self.method, self.path

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def protocol_headers(self) -> dict[str, str]:
        """The headers that carry the provider's protocol (auth, API version, ...), not the client's own."""
        return {name: value for name, value in self.headers.items()
                if name not in TRANSPORT_HEADERS and not name.startswith(("x-stainless-", "x-goog-api-client"))}


def assert_same_call(server: RecordingServer, protocol_headers: Mapping[str, str]) -> None:
    """The SDK's request (the first recorded) and ours (the second) went to the same route with the same
    query and JSON body, and both carried exactly `protocol_headers` (auth, API version)."""
    theirs, ours = server.exchanges
    assert ours.route == theirs.route
    assert ours.query == theirs.query
    assert ours.protocol_headers() == theirs.protocol_headers() == dict(protocol_headers)
    assert ours.json() == theirs.json()


@dataclass
class Answer:
    method: str
    pattern: re.Pattern[str]
    status: int
    body: bytes
    headers: dict[str, str]


@dataclass
class RecordingServer:
    url: str = ""
    exchanges: list[Exchange] = field(default_factory=list)
    _answers: list[Answer] = field(default_factory=list)

    def answer(self, method: str, path_pattern: str, status: int, body: bytes | str | Any,
               headers: Mapping[str, str] | None = None) -> None:
        """Answer `method` on a path matching `path_pattern` (whole path) with `status` and `body` (bytes sent
        as they are, anything else as JSON). A later answer for the same request takes precedence."""
        if not isinstance(body, bytes):
            body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self._answers.insert(0, Answer(method, re.compile(path_pattern), status, body,
                                       {"Content-Type": "application/json", **(headers or {})}))

    def clear(self) -> None:
        self.exchanges.clear()

    def only(self) -> Exchange:
        """The one request recorded since the last `clear`."""
        assert len(self.exchanges) == 1, [e.route for e in self.exchanges]
        return self.exchanges[0]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.exchanges.append(Exchange(request.method, request.path, dict(request.query),
                                       {k.lower(): v for k, v in request.headers.items()}, body))
        for answer in self._answers:
            if answer.method == request.method and answer.pattern.fullmatch(request.path):
                return web.Response(status=answer.status, body=answer.body, headers=answer.headers)
        return web.json_response({"error": f"nothing scripted for {request.method} {request.path}"}, status=404)


@contextlib.asynccontextmanager
async def recording() -> AsyncIterator[RecordingServer]:
    server = RecordingServer()
    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", server._handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()
