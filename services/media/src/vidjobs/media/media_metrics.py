"""The media service's metrics, created once per process with bounded labels (never a job id)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DOWNLOAD_BYTES = Counter("vidjobs_media_download_bytes_total", "Bytes streamed from providers")
DOWNLOAD_SECONDS = Histogram(
    "vidjobs_media_download_seconds", "Time to stream one render from its provider",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
COPIES = Counter(
    "vidjobs_media_copies_total", "Render copies by outcome (completed, retry, failed) and error code",
    ["outcome", "code"],
)
VERIFICATIONS = Counter(
    "vidjobs_media_verifications_total", "Renders checked, by outcome (ok or an error code)", ["outcome"]
)
STORE_MISMATCHES = Counter(
    "vidjobs_media_store_mismatches_total",
    "Objects the store did not keep intact (size or SHA-256 read back differed) after every store of them",
)
OBJECTS_DELETED = Counter("vidjobs_media_objects_deleted_total", "Stored objects removed for deleted jobs")
TRANSCODE_SECONDS = Histogram(
    "vidjobs_media_transcode_seconds", "Time to verify a render and make its thumbnail and preview",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
UPLOADS = Counter(
    "vidjobs_media_uploads_total",
    "Uploaded images decoded, by outcome (ready, rejected) and rejection reason (empty when ready)",
    ["outcome", "reason"],
)
UPLOADS.labels("ready", "")  # exported from the start, at 0: a panel shows none decoded rather than no data
