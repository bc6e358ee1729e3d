"""A Python client for the vidjobs API.

    from vidjobs_client import Client

    with Client("http://127.0.0.1:8080", api_key="vj_...") as vj:
        job = vj.create_job("fake/default", "a red fox in snow", duration_s=5)
        job = vj.wait(job.id, on_change=lambda j: print(j.stage))
        if job.succeeded:
            vj.download(job, "fox.mp4")  # checked against the job's sha256

`AsyncClient` (from `vidjobs_client.aio`, also exported here) has the same methods, awaitable.

A product's backend manages its users' accounts with a platform key (`vjp_...`):

    from vidjobs_client import Platform

    with Platform("http://127.0.0.1:8080", platform_key="vjp_...") as platform:
        account = platform.create_account("user_8412", plan="pro")  # the same user again: the same account
        platform.grant_credits(account.id, 500, idempotency_key="evt_123")  # once, however often it is sent
        token = platform.create_token(account.id, scopes=["read"], ttl_s=900)  # for the user's browser
        with platform.acting_for(account.id) as vj:  # a Client calling the account's own routes
            vj.create_job("fake/default", "a red fox in snow")

`AsyncPlatform` is the same, awaitable.
"""

from .aio import AsyncClient, AsyncPlatform
from .client import Client, Platform
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
from .models import (
    TERMINAL,
    Account,
    BrowserToken,
    Estimate,
    Export,
    Job,
    JobPage,
    Model,
    PlatformAccount,
    QueueEstimate,
    ReadyEstimate,
    Retry,
    Transition,
    Upload,
)
from .retrying import RetryPolicy

__version__ = "0.3.0"
__all__ = [
    "TERMINAL", "APIError", "Account", "AsyncClient", "AsyncPlatform", "AuthenticationError", "BrowserToken",
    "ChecksumMismatch", "Client", "ConfigurationError", "Conflict", "ConnectionFailed", "Estimate", "Export",
    "InsufficientCredits", "InvalidRequest", "Job", "JobNotReady", "JobPage", "Model", "NotFound", "Platform",
    "PlatformAccount", "QueueEstimate", "RateLimited", "ReadyEstimate", "Retry", "RetryPolicy", "Transition",
    "Unavailable", "Upload", "UploadRejected", "VidjobsError", "WaitTimeout",
]
