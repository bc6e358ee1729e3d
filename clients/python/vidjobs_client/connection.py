"""Where the API is and which key to show it: arguments first, then the environment."""

from __future__ import annotations

import os
import secrets
from typing import Any

from .calls import Call
from .errors import ConfigurationError

DEFAULT_URL = "http://127.0.0.1:8080"
URL_VARIABLE = "VIDJOBS_URL"
KEY_VARIABLE = "VIDJOBS_API_KEY"
USER_AGENT = "vidjobs-client/0.2.0"


def resolve(base_url: str | None, api_key: str | None) -> tuple[str, str]:
    url = (base_url or os.environ.get(URL_VARIABLE) or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"the API URL {url!r} must start with http:// or https://")
    key = api_key or os.environ.get(KEY_VARIABLE)
    if not key:
        raise ConfigurationError(f"no API key: pass api_key= or set {KEY_VARIABLE}")
    return url, key


def request_headers(call: Call[Any], api_key: str) -> dict[str, str]:
    # One id for every try of a call, so the API's logs show the retries of one request together.
    return {**call.headers, "Authorization": f"Bearer {api_key}", "X-Request-Id": "req_" + secrets.token_hex(12)}

