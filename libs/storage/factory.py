"""Choose the storage backend from VIDJOBS_STORAGE_URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from libs.common.errors import ConfigError
from libs.common.settings import Settings
from libs.storage.base import Storage
from libs.storage.filesystem import FileStorage


def open_storage(settings: Settings) -> Storage:
    url = urlparse(settings.storage_location())
    if url.scheme == "file":
        if not settings.signing_secret:
            raise ConfigError("VIDJOBS_SIGNING_SECRET must be set for the file:// storage backend")
        return FileStorage(Path(url.path), base_url=settings.gateway_url, secret=settings.signing_secret)
    raise ConfigError(f"VIDJOBS_STORAGE_URL scheme {url.scheme!r} is not supported; use file:///path")
