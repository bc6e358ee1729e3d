"""A Python client for the vidjobs API.

    from vidjobs_client import Client

    with Client("http://127.0.0.1:8080", api_key="vj_...") as vj:
        job = vj.create_job("fake/default", "a red fox in snow", duration_s=5)
        job = vj.wait(job.id, on_change=lambda j: print(j.stage))
        if job.succeeded:
            vj.download(job, "fox.mp4")  # checked against the job's sha256

`AsyncClient` (from `vidjobs_client.aio`, also exported here) has the same methods, awaitable.
"""

from .aio import AsyncClient
from .client import Client
from .errors import (
    APIError,
    AuthenticationError,
    ChecksumMismatch,
    ConfigurationError,
    Conflict,
    ConnectionFailed,
    InsufficientCredits,
    InvalidRequest,
    JobNotReady,
    NotFound,
    RateLimited,
    Unavailable,
    UploadRejected,
    VidjobsError,
    WaitTimeout,
)
from .models import TERMINAL, Account, Estimate, Export, Job, JobPage, Model, QueueEstimate, Transition, Upload
from .retrying import RetryPolicy

__version__ = "0.2.0"
__all__ = [
    "TERMINAL", "APIError", "Account", "AsyncClient", "AuthenticationError", "ChecksumMismatch", "Client",
    "ConfigurationError", "Conflict", "ConnectionFailed", "Estimate", "Export", "InsufficientCredits",
    "InvalidRequest", "Job", "JobNotReady", "JobPage", "Model", "NotFound", "QueueEstimate", "RateLimited",
    "RetryPolicy", "Transition", "Unavailable", "Upload", "UploadRejected", "VidjobsError", "WaitTimeout",
]
