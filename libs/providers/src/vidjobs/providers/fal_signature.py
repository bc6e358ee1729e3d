"""fal.ai webhook signatures: ED25519, checked against the public keys fal publishes as a JWKS.

A delivery carries `X-Fal-Webhook-Request-Id`, `X-Fal-Webhook-User-Id`, `X-Fal-Webhook-Timestamp` (unix
seconds) and `X-Fal-Webhook-Signature` (hex). The signed message is the request id, the user id, the timestamp
and the hex SHA-256 of the raw body, joined by newlines. The signature names no key, so a delivery is good when
any published key verifies it; the timestamp is signed too, so a captured delivery cannot be replayed once it
falls outside the tolerance.

Verification is synchronous (the adapter protocol's `verify_callback` is) and never waits on the network: it
reads keys cached in memory. `Jwks` fetches them in the background — as soon as it is built inside a running
event loop, again when the cache grows old, and once more when a signature matches no key we know (fal may
have rotated its keys). Until the first fetch lands every delivery is refused with 401, which fal answers by
retrying the delivery later. `Verifier.verify_fresh` is the same check for an async caller: it waits for the
keys instead of refusing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import time
from collections.abc import Callable, Mapping

import aiohttp
import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from vidjobs.common.errors import WebhookRejected

log = logging.getLogger("vidjobs.providers.fal")

REQUEST_ID_HEADER = "X-Fal-Webhook-Request-Id"
USER_ID_HEADER = "X-Fal-Webhook-User-Id"
TIMESTAMP_HEADER = "X-Fal-Webhook-Timestamp"
SIGNATURE_HEADER = "X-Fal-Webhook-Signature"

JWKS_TTL_S = 24 * 3600.0  # fal's own examples cache its keys for a day
REFETCH_GAP_S = 60.0  # at most one early refetch a minute, however many unknown signatures arrive
FETCH_TIMEOUT_S = 10.0
_SIGNATURE_BYTES = 64


def signed_message(request_id: str, user_id: str, timestamp: str, body: bytes) -> bytes:
    return "\n".join((request_id, user_id, timestamp, hashlib.sha256(body).hexdigest())).encode()


# --- the key set -------------------------------------------------------------------------------------------


class _Jwk(msgspec.Struct, kw_only=True):
    kty: str = ""
    crv: str = ""
    x: str = ""


class _KeySet(msgspec.Struct):
    keys: list[_Jwk]


def parse_jwks(raw: bytes) -> list[Ed25519PublicKey]:
    """The ED25519 keys of a JWKS document; other kinds of key are skipped. Raises ValueError when the
    document is malformed or holds no ED25519 key at all."""
    try:
        document = msgspec.json.decode(raw, type=_KeySet)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a JWKS document: {exc}") from exc
    keys = [_public_key(jwk) for jwk in document.keys if jwk.kty == "OKP" and jwk.crv == "Ed25519"]
    if not keys:
        raise ValueError("the JWKS document holds no Ed25519 key")
    return keys


def _public_key(jwk: _Jwk) -> Ed25519PublicKey:
    try:
        raw = base64.urlsafe_b64decode(jwk.x + "=" * (-len(jwk.x) % 4))
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"an Ed25519 key whose `x` is not 32 base64url bytes: {jwk.x[:16]!r}") from exc


class Jwks:
    """fal's public keys as last fetched, refreshed in the background and read synchronously."""

    def __init__(self, session: aiohttp.ClientSession, url: str, *, ttl_s: float = JWKS_TTL_S,
                 refetch_gap_s: float = REFETCH_GAP_S, clock: Callable[[], float] = time.monotonic):
        self.session = session
        self.url = url
        self.ttl_s = ttl_s
        self.refetch_gap_s = refetch_gap_s
        self.clock = clock
        self.keys: list[Ed25519PublicKey] = []
        self.fetches = 0  # attempts, successful or not
        self._fetched_at: float | None = None  # last successful fetch
        self._tried_at: float | None = None  # last attempt
        self._task: asyncio.Task[bool] | None = None
        self._lock = asyncio.Lock()

    @property
    def stale(self) -> bool:
        return self._fetched_at is None or self.clock() - self._fetched_at >= self.ttl_s

    @property
    def refreshing(self) -> bool:
        return self._task is not None and not self._task.done()

    def may_refetch(self) -> bool:
        return self._tried_at is None or self.clock() - self._tried_at >= self.refetch_gap_s

    def refresh_soon(self) -> None:
        """Start a background fetch unless one is running or the last attempt was too recent. Does nothing
        outside a running event loop (there is nobody to run it)."""
        if self.refreshing or not self.may_refetch():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self.refresh(), name="fal-jwks-refresh")
        self._task.add_done_callback(_report_failure)

    async def refresh(self) -> bool:
        """Fetch the key set now. A failed fetch keeps the keys we had; True when new keys were stored."""
        async with self._lock:
            self._tried_at = self.clock()
            self.fetches += 1
            try:
                keys = await self._fetch()
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("fal signing keys could not be fetched", extra={"url": self.url, "error": str(exc)})
                return False
            self.keys, self._fetched_at = keys, self.clock()
            return True

    async def ensure(self) -> None:
        """Wait for a usable key set: fetch now when there is none, or when it has grown old."""
        if self.refreshing:
            assert self._task is not None
            await asyncio.shield(self._task)
        if self.stale and self.may_refetch():
            await self.refresh()

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _fetch(self) -> list[Ed25519PublicKey]:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with self.session.get(self.url, timeout=timeout) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise ValueError(f"the JWKS endpoint answered HTTP {resp.status}")
        return parse_jwks(raw)


def _report_failure(task: asyncio.Task[bool]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("fal signing key refresh failed", exc_info=exc)


# --- verification ------------------------------------------------------------------------------------------


class UnknownKey(WebhookRejected):
    """Well-formed and fresh, but no key we hold verifies it (or we hold none yet)."""


class Verifier:
    def __init__(self, jwks: Jwks, *, tolerance_s: float = 300):
        self.jwks = jwks
        self.tolerance_s = tolerance_s

    def verify(self, headers: Mapping[str, str], body: bytes, *, now: float | None = None) -> str:
        """Check a delivery against the cached keys and return its request id (one per fal request, the
        same on every retry). Raises WebhookRejected; asks for fresh keys when none of ours fits."""
        request_id, message, signature = self._message(headers, body, now)
        if self.jwks.stale:
            self.jwks.refresh_soon()  # old keys still verify while new ones are fetched
        try:
            return self._match(request_id, message, signature)
        except UnknownKey:
            self.jwks.refresh_soon()
            raise

    async def verify_fresh(self, headers: Mapping[str, str], body: bytes) -> str:
        """The same check for an async caller: it waits for keys instead of refusing without them, and
        refetches once when the signature matches no key we hold."""
        request_id, message, signature = self._message(headers, body, None)  # refused before any fetch
        await self.jwks.ensure()
        try:
            return self._match(request_id, message, signature)
        except UnknownKey:
            if not self.jwks.may_refetch() or not await self.jwks.refresh():
                raise
        return self._match(request_id, message, signature)

    def _match(self, request_id: str, message: bytes, signature: bytes) -> str:
        if not self.jwks.keys:
            raise UnknownKey("fal's signing keys are not loaded yet; fal retries the delivery")
        if any(_verifies(key, signature, message) for key in self.jwks.keys):
            return request_id
        raise UnknownKey("the signature matches none of fal's published keys")

    def _message(self, headers: Mapping[str, str], body: bytes, now: float | None) -> tuple[str, bytes, bytes]:
        request_id = _header(headers, REQUEST_ID_HEADER)
        user_id = _header(headers, USER_ID_HEADER)
        timestamp = _header(headers, TIMESTAMP_HEADER)
        self._check_fresh(timestamp, now)
        signature = _signature(_header(headers, SIGNATURE_HEADER))
        return request_id, signed_message(request_id, user_id, timestamp, body), signature

    def _check_fresh(self, raw: str, now: float | None) -> None:
        if not (raw.isascii() and raw.isdigit()):
            raise WebhookRejected(f"{TIMESTAMP_HEADER} {raw[:32]!r} is not unix seconds")
        skew = (time.time() if now is None else now) - int(raw)
        if abs(skew) > self.tolerance_s:
            when = "old" if skew > 0 else "in the future"
            raise WebhookRejected(f"{TIMESTAMP_HEADER} is {abs(skew):.0f}s {when}, beyond the "
                                  f"{self.tolerance_s:.0f}s tolerance")


def _verifies(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def _signature(raw: str) -> bytes:
    try:
        signature = bytes.fromhex(raw)
    except ValueError:
        signature = b""
    if len(signature) != _SIGNATURE_BYTES:
        raise WebhookRejected(f"{SIGNATURE_HEADER} is not a hex ED25519 signature")
    return signature


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:  # a plain dict is case-sensitive; HTTP header names are not
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    if not value:
        raise WebhookRejected(f"missing {name} header")
    # fal's ids, timestamp and hex signature are ASCII. Other bytes arrive as text that cannot be encoded
    # again into the signed message, so they are refused here as unverifiable.
    if not value.isascii():
        raise WebhookRejected(f"{name} header is not ASCII")
    return value
