"""How the default run spends its time: the record of what each test costs, the order tests are handed to the
workers, and the tests that must have the machine to themselves.

- `tests/durations.json` records each test's seconds (setup, call and teardown) in a default run;
  `pytest --record-durations` rewrites the entries of the tests it ran. Tests are handed out longest first, so
  no long test starts last and holds the run's end on one worker, and quiet tests after all the others;
  tests/test_budget.py holds the default selection to the budget that file states.
- `quiet`: a test that measures time or CPU runs with no other test running on any worker (a writer-preferring
  lock over the workers' processes), so its figures are its own and not the load of its neighbours.
- `long`: the long scenarios (fault runs at full length, soak, load) that the default run deselects; each has a
  short version in the default run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vidjobs.cli.embedded import PORT_SLICE_ENV

RECORD = Path(__file__).with_name("durations.json")
LOCKS_ENV = "VIDJOBS_TEST_LOCKS"
# A test missing from the record (new, or renamed) is handed out as if it took this long: early enough that
# a long newcomer cannot end the run alone, late enough not to push recorded long tests back.
UNRECORDED_S = 10.0


def base_id(nodeid: str) -> str:
    """A test's id without the `@group` suffix pytest-xdist adds under `--dist loadgroup` (an `@` inside the
    test's parameters, as in `[s3://user:pw@bucket]`, is the id's own)."""
    head, at, group = nodeid.rpartition("@")
    return head if at and "]" not in group and "::" not in group else nodeid


def load_record(path: Path = RECORD) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {"tests": {}}
    return data


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help="write each test's seconds (setup + call + teardown) into tests/durations.json")


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # a pytest-xdist worker: its own slice of the free ports (vidjobs.cli.embedded)
        index = int(workerinput["workerid"].removeprefix("gw"))
        os.environ[PORT_SLICE_ENV] = f"{index}/{workerinput['workercount']}"
    # The controller makes the folder of the cross-worker locks; pytest-xdist's workers inherit its environment.
    if not hasattr(config, "workerinput") and LOCKS_ENV not in os.environ:
        folder = tempfile.mkdtemp(prefix="vidjobs-test-locks-")
        os.environ[LOCKS_ENV] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first. A module whose fixtures are module-scoped stays together, on one worker, in its own order:
    split up, each piece would set those fixtures up again."""
    recorded: dict[str, float] = load_record()["tests"]
    module_total: dict[str, float] = defaultdict(float)
    for item in items:
        module_total[_module_of(item)] += recorded.get(item.nodeid, UNRECORDED_S)
    order: dict[int, tuple[float, int]] = {}
    for index, item in enumerate(items):
        if _has_module_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(_module_of(item)))
            order[id(item)] = (module_total[_module_of(item)], -index)
        else:
            order[id(item)] = (recorded.get(item.nodeid, UNRECORDED_S), -index)
    items.sort(key=lambda item: order[id(item)], reverse=True)
    # Quiet tests last: one handed out early waits, holding the gate shut to every other worker, for the
    # longest tests of the run (already started, longest first) to end. At the end it waits for short ones.
    items.sort(key=lambda item: item.get_closest_marker("quiet") is not None)


# What this session collected and what its options left out: tests/test_budget.py reads the default run's
# selection from the session running it, when that session is the default run, instead of collecting again.
SELECTED = pytest.StashKey[list[pytest.Item]]()
DESELECTED = pytest.StashKey[list[pytest.Item]]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash.setdefault(DESELECTED, []).extend(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[SELECTED] = list(session.items)


def _module_of(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    return module.__name__ if module is not None else ""


def _has_module_fixtures(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None or not _module_of(item):
        return False
    return any(d.scope in ("module", "package", "class") for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with machine_share(exclusive=item.get_closest_marker("quiet") is not None):
        return (yield)


@contextlib.contextmanager
def machine_share(*, exclusive: bool) -> Iterator[None]:
    """A share of the machine for one test: every test holds the run's lock shared, a quiet test holds it alone.
    Writer-preferring: a quiet test takes the gate first, so tests that start after it wait behind it instead of
    keeping the lock shared for ever."""
    folder = os.environ.get(LOCKS_ENV)
    if not folder:
        yield
        return
    with open(Path(folder) / "gate", "a") as gate, open(Path(folder) / "run", "a") as run:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(run, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(run, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)


class DurationRecorder:
    """Adds up each test's phases as the reports arrive (on the controller under pytest-xdist)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[base_id(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.seconds:
            return
        record = load_record()
        record["tests"] = dict(sorted({**record.get("tests", {}),
                                       **{k: round(v, 2) for k, v in self.seconds.items()}}.items()))
        RECORD.write_text(json.dumps(record, indent=1) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "vidjobs-duration-recorder")
