"""What a job is expected to cost, reserved from the account's credit when the job is created."""

from __future__ import annotations

import math

from libs.common.jobs import JobRequest

CREDITS_PER_SECOND = 10
# More pixels cost the provider more; 480p and 720p are priced alike to keep the table easy to reason about.
RESOLUTION_FACTOR = {"480p": 1.0, "720p": 1.0, "1080p": 1.5}


def estimate_credits(request: JobRequest) -> int:
    return math.ceil(request.duration_s * CREDITS_PER_SECOND * RESOLUTION_FACTOR[request.resolution])
