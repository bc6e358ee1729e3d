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
PLATFORM_KEY_VARIABLE = "VIDJOBS_PLATFORM_KEY"
ACTING_FOR = "Vidjobs-Account"  # the account a platform key calls an account's routes for
USER_AGENT = "vidjobs-client/0.3.0"


def resolve(base_url: str | None, api_key: str | None, *, what: str = "API key", argument: str = "api_key",
            variable: str = KEY_VARIABLE) -> tuple[str, str]:
    url = (base_url or os.environ.get(URL_VARIABLE) or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"the API URL {url!r} must start with http:// or https://")
    key = api_key or os.environ.get(variable)
    if not key:
        raise ConfigurationError(f"no {what}: pass {argument}= or set {variable}")
    return url, key


def request_headers(call: Call[Any], api_key: str, account_id: str | None = None) -> dict[str, str]:
    # One id for every try of a call, so the API's logs show the retries of one request together.
    headers = {**call.headers, "Authorization": f"Bearer {api_key}", "X-Request-Id": "req_" + secrets.token_hex(12)}
    if account_id is not None:
        headers[ACTING_FOR] = account_id
    return headers

