"""Which failures belong to the infrastructure rather than to the job (docs/ARCHITECTURE.md "Faults").

A database that restarts, a lock or statement timeout, JetStream without a leader, an object store answering
5xx or a full disk say nothing about the job in hand: the same work succeeds once the part is back. Such a
failure defers the work with backoff, bounded by the stage's deadline (the reaper fails a stage that outlives
it), and never counts towards dead-lettering. Everything else is the job's own fault or a bug, and counts.
"""

from __future__ import annotations

import asyncpg
import nats.errors

from vidjobs.common.errors import PartUnavailable

# SQLSTATE classes and codes that a retry of the same work can outlive.
_POSTGRES_TRANSIENT: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # 08: the connection failed or was dropped
    asyncpg.exceptions.OperatorInterventionError,  # 57: statement timeout, admin shutdown, starting up
    asyncpg.exceptions.LockNotAvailableError,  # 55P03: lock_timeout
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,  # 25P03: the server ended an idle transaction
    asyncpg.exceptions.TransactionRollbackError,  # 40: deadlock, serialization failure
    asyncpg.exceptions.InsufficientResourcesError,  # 53: disk full, out of memory, too many connections
    asyncpg.exceptions.PostgresSystemError,  # 58: I/O error on the server
    asyncpg.InterfaceError,  # the connection was closed under a running query
)

INFRASTRUCTURE: tuple[type[BaseException], ...] = (
    *_POSTGRES_TRANSIENT,
    nats.errors.Error,  # no responders, no leader, timeouts, a closed connection
    PartUnavailable,  # object store 5xx, throttled or unreachable (storage's StorageUnavailable)
    OSError,  # connection refused or reset, disk full (ENOSPC), read-only file system
    TimeoutError,  # a pool acquire or command that outlived its bound
)


def is_infrastructure(exc: BaseException) -> bool:
    """True when `exc` is a fault of a part we run on, not of the work. Our own typed errors (a provider's
    answer, a failed download, a missing object) are never reclassified by what they were raised from."""
    return isinstance(exc, INFRASTRUCTURE)
