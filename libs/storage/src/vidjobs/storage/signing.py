"""Signed, expiring URLs for objects the gateway serves itself (the filesystem backend).

The signature is an HMAC over method, object key and expiry, so a URL reads one object, with one method,
until one moment; changing any of them, or the secret, makes it invalid.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import quote

FILES_PATH = "/files/"


def _mac(secret: str, method: str, key: str, expires: int) -> str:
    message = f"{method.upper()}\n{key}\n{expires}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(base_url: str, secret: str, key: str, ttl_s: int, *, method: str = "GET") -> tuple[str, float]:
    expires = int(time.time()) + ttl_s
    sig = _mac(secret, method, key, expires)
    return f"{base_url.rstrip('/')}{FILES_PATH}{quote(key)}?expires={expires}&sig={sig}", float(expires)


def verify(secret: str, key: str, expires: str, sig: str, *, method: str = "GET") -> bool:
    """True only for an unexpired URL whose signature matches. HEAD is allowed wherever GET is."""
    try:
        expiry = int(expires)
    except ValueError:
        return False
    if expiry < time.time():
        return False
    method = "GET" if method.upper() == "HEAD" else method
    # A MAC is hex: anything else cannot match, and compare_digest refuses non-ASCII text with TypeError.
    if not sig.isascii():
        return False
    return hmac.compare_digest(_mac(secret, method, key, expiry).encode(), sig.encode())
