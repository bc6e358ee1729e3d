"""Choose the storage backend from VIDJOBS_STORAGE_URL: `file:///path` or `s3://bucket[/prefix]`."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from vidjobs.common.errors import ConfigError
from vidjobs.common.settings import Settings
from vidjobs.storage.base import Storage
from vidjobs.storage.filesystem import FileStorage

# S3's rules for bucket names: 3-63 lowercase letters, digits, dots and hyphens, a letter or digit at each end.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def open_storage(settings: Settings) -> Storage:
    if settings.store_verify_attempts < 1:
        raise ConfigError("VIDJOBS_STORE_VERIFY_ATTEMPTS must be at least 1")
    location = settings.storage_location()
    url = urlsplit(location)
    if url.scheme == "file":
        if not settings.signing_secret:
            raise ConfigError("VIDJOBS_SIGNING_SECRET must be set for the file:// storage backend")
        return FileStorage(Path(url.path), base_url=settings.gateway_url, secret=settings.signing_secret)
    if url.scheme == "s3":
        return _open_s3(settings, url, location)
    raise ConfigError(f"VIDJOBS_STORAGE_URL scheme {url.scheme!r} is not supported; use file:///path or "
                      "s3://bucket/prefix")


def _open_s3(settings: Settings, url: SplitResult, location: str) -> Storage:
    # Imported here: botocore takes a third of a second to import, which a process on the filesystem backend
    # (every `vidjobs up` and test stack) would pay at every start for nothing.
    from botocore.exceptions import BotoCoreError

    from vidjobs.storage.s3 import MIN_PART_BYTES, S3Storage, TimeLimits

    bucket, prefix = parse_s3_url(url, location)
    if settings.storage_timeout_s <= 0 or settings.storage_attempts < 1:
        raise ConfigError("VIDJOBS_STORAGE_TIMEOUT_S must be above 0 and VIDJOBS_STORAGE_ATTEMPTS at least 1")
    if settings.s3_part_bytes < MIN_PART_BYTES:
        raise ConfigError(f"VIDJOBS_S3_PART_BYTES must be at least {MIN_PART_BYTES} (S3's smallest part)")
    try:
        limits = TimeLimits(timeout_s=settings.storage_timeout_s, attempts=settings.storage_attempts)
        return S3Storage(bucket, prefix, part_bytes=settings.s3_part_bytes, limits=limits)
    except BotoCoreError as exc:  # an unknown AWS_PROFILE, an unreadable config file
        raise ConfigError(f"the AWS configuration for VIDJOBS_STORAGE_URL {location!r} is unusable: {exc}") from exc


def parse_s3_url(url: SplitResult, location: str) -> tuple[str, str]:
    """Bucket and key prefix of `s3://bucket[/prefix]`; credentials and endpoint come from AWS variables."""
    bucket = url.netloc
    if not bucket:
        raise ConfigError(f"VIDJOBS_STORAGE_URL {location!r} names no bucket; use s3://bucket/prefix")
    if url.query or url.fragment or not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ConfigError(f"VIDJOBS_STORAGE_URL {location!r} is not s3://bucket/prefix with a valid bucket name "
                          "(3-63 lowercase letters, digits, dots, hyphens; endpoint and keys go in AWS_* variables)")
    segments = [s for s in url.path.split("/") if s]
    if any(s in {".", ".."} for s in segments):
        raise ConfigError(f"VIDJOBS_STORAGE_URL {location!r} has '.' or '..' in its prefix")
    return bucket, "/".join(segments)
