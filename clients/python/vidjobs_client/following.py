"""Following a job over its Server-Sent Events stream, through dropped connections.

The API sends the whole job on connect and on every change, so reconnecting loses nothing: the first event of
a new connection is the job as it stands. `Follower` holds what both clients need between connections: the
parser, which job was shown last (a reconnect repeats it; it is not shown twice) and how many connections in a
row ended before any event arrived, which bounds the retries.
"""

from __future__ import annotations

import dataclasses

import httpx
import msgspec

from .calls import Call, stream_path
from .errors import APIError
from .models import Job
from .retrying import RetryPolicy

# The API writes a keepalive comment every 15 s; three missed in a row means the connection is gone.
READ_TIMEOUT_S = 45.0


class EventParser:
    """The text/event-stream format, a line at a time: an event is complete at its blank line."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def line(self, line: str) -> tuple[str, str] | None:
        if not line:
            event, data = self._event or "message", self._data
            self._event, self._data = "", []
            return (event, "\n".join(data)) if data else None
        if line.startswith(":"):
            return None  # a comment: the keepalive
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


class Follower:
    def __init__(self, job_id: str, policy: RetryPolicy) -> None:
        self.call: Call[Job] = Call("GET", stream_path(job_id), Job)
        self._policy = dataclasses.replace(policy, attempts=policy.reconnects)
        self._parser = EventParser()
        self._shown: tuple[object, ...] | None = None
        self._ended_early = 0  # connections in a row that ended before any event

    def connected(self) -> None:
        self._parser = EventParser()

    def line(self, line: str) -> Job | None:
        """The job to show for this line, if it completes a new state of the job."""
        event = self._parser.line(line)
        if event is None or event[0] != "job":
            return None
        self._ended_early = -1  # this connection delivered: the next drop starts the count again
        job = msgspec.json.decode(event[1], type=Job)
        # Signed URLs are signed afresh on every read, so they do not make a job new.
        seen = (job.status, job.stage, job.progress, job.queue_position, job.attempt, job.updated_at, job.estimate,
                job.ready)
        if seen == self._shown:
            return None
        self._shown = seen
        return job

    def dropped(self, failure: httpx.TransportError | None) -> float:
        """The wait before connecting again, or raise when the connections keep failing."""
        self._ended_early += 1
        if failure is None:
            failure = httpx.RemoteProtocolError("the stream ended before the job finished")
        return self._policy.after_failure(self.call, max(1, self._ended_early), failure)

    def refused(self, error: APIError) -> float:
        self._ended_early += 1
        return self._policy.after_refusal(self.call, max(1, self._ended_early), error)


class StreamEnded(Exception):
    """The connection closed cleanly before the job finished (a gateway restarting, say): connect again."""


class StreamRefused(Exception):
    """The API refused to open the stream."""

    def __init__(self, error: APIError) -> None:
        super().__init__(str(error))
        self.error = error
