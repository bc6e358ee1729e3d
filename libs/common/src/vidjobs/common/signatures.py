"""Standard Webhooks (standardwebhooks.com): the one signing scheme of both directions. Providers that speak
it sign the callbacks they send us (checked by the adapters, vidjobs.providers.http.SignedCallbacks, and sent
by the fake provider), and the gateway signs the webhooks it sends to an account's app with the same scheme.

A secret is `whsec_` followed by the base64 of the key bytes, read as the reference library (standardwebhooks)
reads it: the prefix may be left out, the padding may be missing (or doubled), and whitespace is ignored; text
that is not base64 is refused at start (`decode_secret`). A delivery carries three headers: `webhook-id` (the
same on every retry of one message, so a receiver can store it once), `webhook-timestamp` (unix seconds of
this attempt) and `webhook-signature`: one or more space-separated `v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">` (several while a key is being rotated). The timestamp is signed too, so a captured
delivery cannot be replayed once it falls outside the tolerance, in either direction.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Mapping, Sequence

from vidjobs.common import ids
from vidjobs.common.errors import ConfigError, WebhookRejected

SECRET_PREFIX = "whsec_"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE_S = 300
_BASE64 = re.compile(r"[A-Za-z0-9+/]*")
_WHITESPACE = re.compile(r"[ \t\r\n\f\v]")


def new_secret(nbytes: int = 32) -> str:
    """A fresh signing secret in the `whsec_<base64>` form both sides are configured with."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(nbytes)).decode()


def new_message_id() -> str:
    return ids.new("msg")


def decode_secret(secret: str) -> bytes:
    """The key bytes of a signing secret, as standardwebhooks derives them from the same text: `whsec_` is
    optional, the base64 may be padded, unpadded or over-padded, and whitespace (a mounted file's newline) is
    ignored. Raises ConfigError, saying why, for what standardwebhooks refuses (nothing after the prefix, a
    length base64 cannot have) and for characters outside base64's alphabet: standardwebhooks drops those
    silently and signs with a key the text does not say (a URL-safe `-`/`_`, a stray quote, `WHSEC_`)."""
    text = _WHITESPACE.sub("", secret).removeprefix(SECRET_PREFIX)
    data = text.rstrip("=")
    if not _BASE64.fullmatch(data):  # the secret's own characters stay out of the message
        raise ConfigError("webhook secret is not `whsec_` followed by base64: it holds characters outside base64's "
                          "alphabet (A-Z, a-z, 0-9, + and /, then = padding at the end only); a URL-safe secret "
                          "(- and _) must be converted to standard base64")
    if len(data) % 4 == 1:
        raise ConfigError(f"webhook secret is not `whsec_` followed by base64: {len(data)} base64 characters "
                          "cannot be whole bytes (one is missing or one too many)")
    key = base64.b64decode(data + "=" * (-len(data) % 4))
    if not key:
        raise ConfigError("webhook secret is empty: nothing follows `whsec_`")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` signature of a delivery."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(decode_secret(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secret: str | Sequence[str], body: bytes, *, msg_id: str | None = None,
                   timestamp: int | None = None) -> dict[str, str]:
    """The three headers of one delivery attempt. Retries pass the same `msg_id` and a new timestamp. Several
    secrets (while one is being rotated out) give one signature each, space-separated, in their order."""
    keys = [secret] if isinstance(secret, str) else list(secret)
    if not keys:
        raise ConfigError("no webhook secret to sign with")
    msg_id = msg_id or new_message_id()
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(sign(key, msg_id, timestamp, body) for key in keys),
    }


def verify(secret: str, headers: Mapping[str, str], body: bytes, *, tolerance_s: float = DEFAULT_TOLERANCE_S,
           now: float | None = None) -> str:
    """Check a delivery's signature and freshness and return its `webhook-id`. Raises WebhookRejected."""
    if not secret:
        raise WebhookRejected("no webhook secret is configured, so no delivery can be trusted")
    msg_id = _header(headers, ID_HEADER)
    timestamp = _fresh_timestamp(_header(headers, TIMESTAMP_HEADER), tolerance_s, now)
    offered = _header(headers, SIGNATURE_HEADER).split()
    expected = sign(secret, msg_id, timestamp, body).encode()
    # Compare every offered v1 signature in constant time; any one matching is enough (key rotation).
    if any(sig.startswith("v1,") and hmac.compare_digest(sig.encode(), expected) for sig in offered):
        return msg_id
    raise WebhookRejected("no v1 signature in webhook-signature matches the body")


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:  # a plain dict is case-sensitive; HTTP header names are not
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    if not value:
        raise WebhookRejected(f"missing {name} header")
    # Every value of these headers is ASCII (an id, digits, base64). Other bytes arrive as text that cannot
    # be encoded again to be signed or compared, so they are refused here as unverifiable.
    if not value.isascii():
        raise WebhookRejected(f"{name} header is not ASCII")
    return value


def _fresh_timestamp(raw: str, tolerance_s: float, now: float | None) -> int:
    if not (raw.isascii() and raw.isdigit()):
        raise WebhookRejected(f"{TIMESTAMP_HEADER} {raw[:32]!r} is not unix seconds")
    timestamp = int(raw)
    skew = (time.time() if now is None else now) - timestamp
    if skew > tolerance_s:
        raise WebhookRejected(f"{TIMESTAMP_HEADER} is {skew:.0f}s old, beyond the {tolerance_s:.0f}s tolerance")
    if -skew > tolerance_s:
        raise WebhookRejected(f"{TIMESTAMP_HEADER} is {-skew:.0f}s in the future, beyond the "
                              f"{tolerance_s:.0f}s tolerance")
    return timestamp
