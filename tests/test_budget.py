"""The default run stays inside its budget, so the next capability pays for its own test time.

tests/durations.json records what each test of the default selection (what `.ci/run` runs) cost in a default run,
and the budget it is held to. A new or renamed test is recorded with `pytest --record-durations <its file>`;
a test too long for the default run goes behind the `long` marker, with a short version left in the default
run (tests/scheduling.py). The long ones carry timeouts of their own, above the global one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from pytest_timeout import _get_item_settings

from tests.scheduling import DESELECTED, SELECTED, base_id, load_record

ROOT = Path(__file__).resolve().parents[1]


class Collected(NamedTuple):
    selected: dict[str, float]  # the default run's tests, each with the timeout pytest-timeout will apply
    deselected: dict[str, float]  # the tests its options leave out (the long ones), likewise
    long: set[str]  # the tests marked long


# One collection from the repository root with the default options, told by a plugin of its own what was
# selected and what was left out, with each test's timeout and markers.
_COLLECT = """
import sys, pytest
from pytest_timeout import _get_item_settings
def line(kind, item):
    long = int(item.get_closest_marker("long") is not None)
    print(kind, item.nodeid, _get_item_settings(item).timeout, long, sep="\\t")
class Tell:
    def pytest_deselected(self, items):
        for item in items:
            line("DESELECTED", item)
    def pytest_collection_finish(self, session):
        for item in session.items:
            line("SELECTED", item)
sys.exit(pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Tell()]))
"""


def _this_session(config: pytest.Config) -> Collected | None:
    """The running session's own collection, when the session is the default run (the test paths of the
    configuration, its `-m 'not long'`, nothing else chosen): what collecting again would give, for free."""
    options = config.option
    if (config.args_source is not pytest.Config.ArgsSource.TESTPATHS or options.keyword
            or options.markexpr != "not long" or options.deselect or getattr(options, "lf", False)
            or SELECTED not in config.stash):
        return None
    found = Collected({}, {}, set())
    for items, into in ((config.stash[SELECTED], found.selected), (config.stash.get(DESELECTED, []), found.deselected)):
        for item in items:
            test = base_id(item.nodeid)
            into[test] = float(_get_item_settings(item).timeout or 0.0)
            if item.get_closest_marker("long") is not None:
                found.long.add(test)
    return found


@pytest.fixture(scope="module")
def collected(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Collected:
    if (mine := _this_session(request.config)) is not None:
        return mine
    out = subprocess.run([sys.executable, "-c", _COLLECT, f"--basetemp={tmp_path_factory.mktemp('collect')}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    found = Collected({}, {}, set())
    for kind, test, timeout, long in (line.split("\t") for line in out.stdout.splitlines()
                                      if line.startswith(("SELECTED\t", "DESELECTED\t"))):
        (found.selected if kind == "SELECTED" else found.deselected)[test] = float(timeout)
        if long == "1":
            found.long.add(test)
    return found


@pytest.fixture(scope="module")
def default_selection(collected: Collected) -> list[str]:
    return list(collected.selected)


def test_every_test_of_the_default_run_is_recorded(default_selection: list[str]) -> None:
    recorded = load_record()["tests"]
    missing = [test for test in default_selection if test not in recorded]
    assert not missing, (
        f"{len(missing)} tests of the default run have no recorded duration, so the budget cannot count them; "
        f"record them with `pytest --record-durations {' '.join(sorted({t.split('::')[0] for t in missing})[:10])}`: "
        f"{missing[:10]}")


def test_the_default_run_fits_its_budget(default_selection: list[str]) -> None:
    record = load_record()
    budget, recorded = record["budget"], record["tests"]
    seconds = {test: recorded.get(test, 0.0) for test in default_selection}
    total = sum(seconds.values())
    slowest = sorted(seconds.items(), key=lambda kv: kv[1], reverse=True)[:10]
    assert total <= budget["test_seconds"], (
        f"the default run's tests add up to {total:.0f} s against a budget of {budget['test_seconds']} s: make "
        f"something cheaper or move a long scenario behind the `long` marker. Slowest: {slowest}")
    too_long = [(test, s) for test, s in seconds.items() if s > budget["longest_test_s"]]
    assert not too_long, (
        f"tests over {budget['longest_test_s']} s belong behind the `long` marker with a short version in the "
        f"default run: {too_long}")


def test_long_scenarios_are_deselected_and_outlast_the_global_timeout(collected: Collected) -> None:
    assert collected.long, "no test is marked long"
    assert collected.long <= set(collected.deselected), sorted(collected.long - set(collected.deselected))
    # The longest long fault run recorded (docs/RELIABILITY.md) took 637 s; the global timeout is 300 s.
    timeouts = {test: collected.deselected[test] for test in collected.long}
    assert all(t >= 2 * 637 for t in timeouts.values()), timeouts
