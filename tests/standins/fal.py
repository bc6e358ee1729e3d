"""A local stand-in for fal.ai's queue API, started in-process by tests, that replays the payloads recorded
in `tests/payloads/fal/` (built from fal's documentation).

Routes, as fal has them:
  POST /{model id}?fal_webhook=<url>            queue a request (the body is the model's input)
  GET  /{owner}/{app}/requests/{id}/status      IN_QUEUE (with queue_position), IN_PROGRESS, COMPLETED
  GET  /{owner}/{app}/requests/{id}             the result, or the failed request's error
  PUT  /{owner}/{app}/requests/{id}/cancel      202 CANCELLATION_REQUESTED, 400 ALREADY_COMPLETED
  GET  /.well-known/jwks.json                   the public half of a freshly generated ED25519 key pair
  GET  /files/{id}.mp4                          a real MP4 (vidjobs.fakeprovider.clips)
Every queue route wants `Authorization: Key <api_key>` (401 otherwise); a request asked for under another app
answers 404, as at fal, and every request asked for under an app is noted in `asked`, so a test can tell
which apps were asked. A finished request is announced to its `fal_webhook` URL with fal's signed headers, and
the delivery is retried (re-signed each time) while the receiver refuses it, as fal does.

A request's scenario comes from its prompt (`plan(prompt, scenario)`), else from `default`. The stand-in's own
readings where fal's documentation is silent: a canceled request is removed (404 from then on), and a rate
limit is answered with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import hashlib
import json
import secrets
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.standins.server import CallingStandin, serving
from vidjobs.fakeprovider.clips import ASPECTS, ClipSpec, clip_size, render_mp4

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "fal"
RATE_LIMITED_SUBMITS = 2  # the rate_limited scenario refuses this many submits of a prompt first
RETRY_AFTER_S = 1
MAX_CLIP_S = 2  # the stand-in's clips are short whatever was asked: they only have to be real videos


class Scenario(enum.StrEnum):
    SUCCESS = "success"  # queued, rendering, completed; an OK webhook
    LONG_QUEUE = "long_queue"  # waits at queue positions 3, 2, 1, 0 first
    CONTENT_REJECTED = "content_rejected"  # completes with a content-policy error
    INVALID_INPUT = "invalid_input"  # completes with a validation error
    RUNNER_FAILURE = "runner_failure"  # completes with fal's infrastructure error
    RATE_LIMITED = "rate_limited"  # the first submits answer 429 with Retry-After, then as success
    UNAVAILABLE = "unavailable"  # every submit answers 503
    REFUSED = "refused"  # submit answers 422: fal judged the input at the door
    REFUSED_CONTENT = "refused_content"  # submit answers 422 for content
    MALFORMED = "malformed"  # submit answers 200 with a body that is not JSON
    NO_WEBHOOK = "no_webhook"  # as success, but never calls back
    HANG = "hang"  # stays in the queue until canceled


# What each scenario ends with: the webhook payload, and the result route's answer.
_WEBHOOKS = {
    Scenario.CONTENT_REJECTED: "webhook_error_content_policy",
    Scenario.INVALID_INPUT: "webhook_error_validation",
    Scenario.RUNNER_FAILURE: "webhook_error_runner",
}
_RESULTS = {
    Scenario.CONTENT_REJECTED: (422, "error_content_policy"),
    Scenario.INVALID_INPUT: (422, "error_validation"),
    Scenario.RUNNER_FAILURE: (503, "error_runner_disconnected"),
}
_AT_SUBMIT = {
    Scenario.UNAVAILABLE: (503, "error_unavailable"),
    Scenario.REFUSED: (422, "error_validation"),
    Scenario.REFUSED_CONTENT: (422, "error_content_policy"),
}


def payload(name: str, **values: Any) -> bytes:
    """A recorded payload with its `${...}` placeholders filled in."""
    text = (PAYLOADS / f"{name}.json").read_text()
    return Template(text).substitute({k: str(v) for k, v in values.items()}).encode()


def payload_json(name: str, **values: Any) -> Any:
    return json.loads(payload(name, **values))


@dataclass
class FalRequest:
    id: str
    model_id: str
    app: str
    input: dict[str, Any]
    webhook_url: str | None
    scenario: Scenario
    created: float
    canceled: bool = False


@dataclass(frozen=True)
class Delivery:
    """One webhook POST attempt and how the receiver answered it (None: it could not be reached)."""

    request_id: str
    status: int | None
    body: bytes


@dataclass
class _Key:
    kid: str
    private: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    @property
    def x(self) -> str:
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class FalStandIn(CallingStandin):
    def __init__(self, *, api_key: str = "test-key", default: Scenario = Scenario.SUCCESS,
                 queue_step_s: float = 0.15, render_s: float = 0.3, user_id: str = "standin-user",
                 retry_delays: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)):
        super().__init__()
        self.api_key = api_key
        self.default = default
        self.queue_step_s = queue_step_s
        self.render_s = render_s
        self.user_id = user_id
        self.retry_delays = retry_delays
        self.scenarios: dict[str, Scenario] = {}
        self.requests: dict[str, FalRequest] = {}
        self.submits: Counter[str] = Counter()  # submit attempts by prompt, refused or not
        self.renders: Counter[str] = Counter()  # requests queued by prompt
        self.deliveries: list[Delivery] = []
        self.asked: list[tuple[str, str]] = []  # (method, path) of every call about a request, whoever held it
        self.jwks_fetches = 0
        self.keys = [_Key(kid=secrets.token_hex(4))]
        self._serving = contextlib.AsyncExitStack()

    # --- lifecycle ---

    async def __aenter__(self) -> FalStandIn:
        app = web.Application()
        app.router.add_get("/.well-known/jwks.json", self._jwks)
        app.router.add_get("/files/{request_id}.mp4", self._file)
        app.router.add_get("/{owner}/{name}/requests/{request_id}/status", self._status)
        app.router.add_get("/{owner}/{name}/requests/{request_id}", self._result)
        app.router.add_put("/{owner}/{name}/requests/{request_id}/cancel", self._cancel)
        app.router.add_post("/{model_id:.+}", self._submit)
        app.cleanup_ctx.append(self.lifetime)
        self.url = await self._serving.enter_async_context(serving(app))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._serving.aclose()

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/.well-known/jwks.json"

    # --- what tests arrange and inspect ---

    def plan(self, prompt: str, scenario: Scenario) -> str:
        self.scenarios[prompt] = scenario
        return prompt

    def rotate_key(self, *, keep_old: bool = False) -> None:
        """Sign with a new key from now on; the JWKS publishes it (and the old one only with `keep_old`)."""
        fresh = _Key(kid=secrets.token_hex(4))
        self.keys = [*self.keys, fresh] if keep_old else [fresh]

    def sign(self, body: bytes, request_id: str, *, timestamp: int | None = None,
             key: Ed25519PrivateKey | None = None) -> dict[str, str]:
        """fal's webhook headers for `body`, signed with the current key (or `key`)."""
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        message = "\n".join([request_id, self.user_id, stamp, hashlib.sha256(body).hexdigest()]).encode()
        signature = (key or self.keys[-1].private).sign(message)
        return {
            "X-Fal-Webhook-Request-Id": request_id,
            "X-Fal-Webhook-User-Id": self.user_id,
            "X-Fal-Webhook-Timestamp": stamp,
            "X-Fal-Webhook-Signature": signature.hex(),
        }

    def webhook_body(self, request: FalRequest) -> bytes:
        name = _WEBHOOKS.get(request.scenario, "webhook_ok")
        return payload(name, request_id=request.id, video_url=self._video_url(request.id),
                       prompt=request.input.get("prompt", ""))

    def delivered(self, request_id: str) -> list[Delivery]:
        return [d for d in self.deliveries if d.request_id == request_id]

    # --- routes ---

    async def _submit(self, request: web.Request) -> web.Response:
        if (refused := self._unauthorized(request)) is not None:
            return refused
        try:
            model_input = await request.json()
        except json.JSONDecodeError:
            return _json(422, payload("error_validation"))
        prompt = str(model_input.get("prompt", ""))
        scenario = self.scenarios.get(prompt, self.default)
        self.submits[prompt] += 1
        if scenario is Scenario.RATE_LIMITED and self.submits[prompt] <= RATE_LIMITED_SUBMITS:
            return _json(429, payload("error_rate_limited"), headers={"Retry-After": str(RETRY_AFTER_S)})
        if scenario in _AT_SUBMIT:
            status, name = _AT_SUBMIT[scenario]
            return _json(status, payload(name, prompt=prompt))
        if scenario is Scenario.MALFORMED:
            return web.Response(status=200, body=b'{"request_id": "', content_type="application/json")
        fal_request = self._queue(request, model_input, scenario)
        answer = payload_json("submit_queued", **self._places(fal_request))
        answer["queue_position"] = self._phase(fal_request)[1]
        return web.json_response(answer)

    async def _status(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        phase, position = self._phase(found)
        if phase == "IN_QUEUE":
            body = payload_json("status_in_queue", **self._places(found))
            body["queue_position"] = position
            return web.json_response(body, status=202)
        if phase == "IN_PROGRESS":
            return _json(202, payload("status_in_progress", **self._places(found)))
        name = "status_completed_error" if found.scenario is Scenario.RUNNER_FAILURE else "status_completed"
        return _json(200, payload(name, **self._places(found)))

    async def _result(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        if self._phase(found)[0] != "COMPLETED":
            return _json(400, json.dumps({"detail": "Request is still in progress"}).encode())
        if found.scenario in _RESULTS:
            status, name = _RESULTS[found.scenario]
            error_type = payload_json(name).get("error_type") if status >= 500 else None
            headers = {"X-Fal-Error-Type": error_type} if error_type else None
            return _json(status, payload(name, prompt=found.input.get("prompt", "")), headers=headers)
        return _json(200, payload("result_video", video_url=self._video_url(found.id)))

    async def _cancel(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        if self._phase(found)[0] == "COMPLETED":
            return _json(400, payload("cancel_already_completed"))
        found.canceled = True
        return _json(202, payload("cancel_requested"))

    async def _jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        document = {"keys": [payload_json("jwks", x=k.x, kid=k.kid)["keys"][0] for k in self.keys]}
        return web.json_response(document)

    async def _file(self, request: web.Request) -> web.Response:
        found = self.requests.get(request.match_info["request_id"])
        if found is None:
            return _json(404, payload("error_not_found"))
        aspect = found.input.get("aspect_ratio")
        width, height = clip_size(aspect if aspect in ASPECTS else "16:9")
        clip = await render_mp4(ClipSpec(width=width, height=height, duration_s=MAX_CLIP_S,
                                         seed=int(found.input.get("seed", 0) or 0)))
        return web.Response(body=clip, content_type="video/mp4")

    # --- the queue ---

    def _queue(self, request: web.Request, model_input: dict[str, Any], scenario: Scenario) -> FalRequest:
        model_id = request.match_info["model_id"]
        fal_request = FalRequest(
            id=str(uuid.uuid4()), model_id=model_id, app="/".join(model_id.split("/")[:2]), input=model_input,
            webhook_url=request.query.get("fal_webhook"), scenario=scenario,
            created=asyncio.get_running_loop().time(),
        )
        self.requests[fal_request.id] = fal_request
        self.renders[str(model_input.get("prompt", ""))] += 1
        if fal_request.webhook_url and scenario not in (Scenario.NO_WEBHOOK, Scenario.HANG):
            self.spawn(self._call_back(fal_request), f"webhook-{fal_request.id}")
        return fal_request

    def _positions(self, fal_request: FalRequest) -> int:
        return 4 if fal_request.scenario is Scenario.LONG_QUEUE else 1

    def _phase(self, fal_request: FalRequest) -> tuple[str, int | None]:
        elapsed = asyncio.get_running_loop().time() - fal_request.created
        steps = self._positions(fal_request)
        if fal_request.scenario is Scenario.HANG or elapsed < steps * self.queue_step_s:
            waited = min(int(elapsed / self.queue_step_s), steps - 1)
            return "IN_QUEUE", steps - 1 - waited
        if elapsed < steps * self.queue_step_s + self.render_s:
            return "IN_PROGRESS", None
        return "COMPLETED", None

    def _done_in(self, fal_request: FalRequest) -> float:
        return self._positions(fal_request) * self.queue_step_s + self.render_s

    async def _call_back(self, fal_request: FalRequest) -> None:
        await asyncio.sleep(self._done_in(fal_request))
        assert self.session is not None and fal_request.webhook_url is not None
        body = self.webhook_body(fal_request)
        for delay in (*self.retry_delays, None):
            headers = {"Content-Type": "application/json", **self.sign(body, fal_request.id)}
            try:
                async with self.session.post(fal_request.webhook_url, data=body, headers=headers) as resp:
                    status: int | None = resp.status
            except aiohttp.ClientError:
                status = None
            self.deliveries.append(Delivery(fal_request.id, status, body))
            if (status is not None and status < 300) or delay is None:
                return
            await asyncio.sleep(delay)

    def _find(self, request: web.Request) -> FalRequest | web.Response:
        self.asked.append((request.method, request.path))
        if (refused := self._unauthorized(request)) is not None:
            return refused
        app = f"{request.match_info['owner']}/{request.match_info['name']}"
        found = self.requests.get(request.match_info["request_id"])
        if found is None or found.app != app or found.canceled:
            return _json(404, payload("error_not_found"))
        return found

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") == f"Key {self.api_key}":
            return None
        return _json(401, payload("error_unauthorized"))

    def _places(self, fal_request: FalRequest) -> dict[str, str]:
        return {"request_id": fal_request.id, "base_url": self.url, "app": fal_request.app}

    def _video_url(self, request_id: str) -> str:
        return f"{self.url}/files/{request_id}.mp4"


def _json(status: int, body: bytes, *, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)
