"""What the `vidjobs` command's exit status means, so a script can tell a typo from a refusal from a render
that did not work out."""

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
    INTERRUPTED = 130  # Ctrl-C; a job already created goes on


EPILOG = "exit status: " + ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}" for code in Exit)
