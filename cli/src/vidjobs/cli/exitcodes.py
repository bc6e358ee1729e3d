"""What the `vidjobs` command's exit status means, so a script can tell a typo from a refusal from a render
that did not work out, and an operator command that found nothing from one the database could not answer."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    JOB_FAILED = 1  # the job ended without a video: failed, canceled or expired
    USAGE = 2  # the command line is wrong, or says too little (no API key, say)
    API_ERROR = 3  # the API refused the request; the message carries its error code and request id
    UNREACHABLE = 4  # the API could not be reached, or stopped answering
    BAD_DOWNLOAD = 5  # the downloaded file is not the one the job describes; it was not kept
    TIMED_OUT = 6  # --timeout passed before the job ended; the job goes on
    NOT_FOUND = 7  # an operator command named something that is not there (a job, account, dead letter ...)
    REFUSED = 8  # an operator command was refused: what it names is in a state that does not allow it
    BACKEND_UNREACHABLE = 9  # an operator command could not reach the database (or NATS)
    SCHEMA_BEHIND = 10  # the database lacks migrations this version needs: run `vidjobs migrate`
    SCHEMA_AHEAD = 11  # the database was migrated by a newer version than this one
    INTERRUPTED = 130  # Ctrl-C; a job already created goes on


EPILOG = "exit status: " + ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}" for code in Exit)


class OperatorFailure(Exception):
    """An operator command could not do what it was asked; `exit` tells a script which way."""

    exit: Exit = Exit.REFUSED


class NotFound(OperatorFailure):
    exit = Exit.NOT_FOUND


class Refused(OperatorFailure):
    exit = Exit.REFUSED


class BackendUnreachable(OperatorFailure):
    exit = Exit.BACKEND_UNREACHABLE


class SchemaBehind(OperatorFailure):
    exit = Exit.SCHEMA_BEHIND


class SchemaAhead(OperatorFailure):
    exit = Exit.SCHEMA_AHEAD
