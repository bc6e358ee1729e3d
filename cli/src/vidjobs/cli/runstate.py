"""What a running `vidjobs up` has started, kept in `up.json` under its data directory, so that the next start
on that directory can deal with whatever a killed run left behind.

A run claims the directory on start: a record naming a `vidjobs up` that still runs refuses the start (two
would fight over one NATS store and one gateway port); processes recorded by a run that is gone and still
running are stopped, services before the NATS server. The embedded PostgreSQL is not recorded here: it detaches
from whoever starts it, keeps its own pid file, and is reused (vidjobs.cli.embedded).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgspec

from vidjobs.cli.processes import Recorded, end, is_alive, record
from vidjobs.common.errors import ConfigError

NATS = "nats-server"


class RunState(msgspec.Struct):
    supervisor: Recorded
    processes: dict[str, Recorded] = msgspec.field(default_factory=dict)


class RunRecord:
    """This run's record. `note` as each process starts (a restarted service replaces its entry), `release`
    on a clean stop."""

    def __init__(self, path: Path, state: RunState):
        self.path = path
        self.state = state

    @classmethod
    def claim(cls, data: Path) -> RunRecord:
        path = data / "up.json"
        if (earlier := _load(path)) is not None:
            if is_alive(earlier.supervisor):
                raise ConfigError(f"`vidjobs up` is already running on {data} (pid {earlier.supervisor.pid}); "
                                  "stop it first, or give this one another --data-dir")
            stop_leftovers(earlier)
        me = record(os.getpid())
        assert me is not None, "this very process runs"
        claimed = cls(path, RunState(me))
        claimed._save()
        return claimed

    def note(self, name: str, pid: int) -> None:
        if (started := record(pid)) is not None:
            self.state.processes[name] = started
            self._save()

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def _save(self) -> None:
        # Written whole and renamed into place: a run killed mid-write leaves the previous record, not half of one.
        partial = self.path.with_suffix(".json.partial")
        partial.write_bytes(msgspec.json.encode(self.state))
        partial.replace(self.path)


def stop_leftovers(earlier: RunState) -> None:
    """Stop what a gone run recorded and still runs: the services first, then the NATS server they use."""
    left = {name: p for name, p in earlier.processes.items() if is_alive(p)}
    if not left:
        return
    names = ", ".join(f"{name} (pid {p.pid})" for name, p in left.items())
    print(f"stopping what an earlier `vidjobs up` left running: {names}", file=sys.stderr, flush=True)
    end([p for name, p in left.items() if name != NATS])
    end([p for name, p in left.items() if name == NATS])


def _load(path: Path) -> RunState | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=RunState)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError):
        return None  # unreadable: nothing in it can be trusted to name our processes
