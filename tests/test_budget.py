"""The default run stays inside its budget, so the next capability pays for its own test time.

tests/durations.json records what each test of the default selection (what `.ci/run` runs) cost in a default run,
and the budget it is held to. A new or renamed test is recorded with `pytest --record-durations <its file>`;
a test too long for the default run goes behind the `long` marker, with a short version left in the default
run (tests/scheduling.py). The long ones carry timeouts of their own, above the global one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.scheduling import load_record

ROOT = Path(__file__).resolve().parents[1]


def _collect(tmp_path: Path, *args: str) -> list[str]:
    """The test ids pytest selects from the repository root with these arguments, as the default run would."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'collect'}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def default_selection(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return _collect(tmp_path_factory.mktemp("default"))


def test_every_test_of_the_default_run_is_recorded(default_selection: list[str]) -> None:
    recorded = load_record()["tests"]
    missing = [test for test in default_selection if test not in recorded]
    assert not missing, (
        f"{len(missing)} tests of the default run have no recorded duration, so the budget cannot count them; "
        f"record them with `pytest --record-durations {' '.join(sorted({t.split('::')[0] for t in missing}))}`: "
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


def test_long_scenarios_are_deselected_and_outlast_the_global_timeout(tmp_path: Path,
                                                                       default_selection: list[str]) -> None:
    long_runs = _collect(tmp_path, "-m", "long")
    assert long_runs, "no test is marked long"
    assert not set(long_runs) & set(default_selection)
    timeouts = _timeouts(tmp_path, long_runs)
    # The longest long fault run recorded (docs/RELIABILITY.md) took 637 s; the global timeout is 300 s.
    assert all(t >= 2 * 637 for t in timeouts.values()), timeouts


def _timeouts(tmp_path: Path, tests: list[str]) -> dict[str, float]:
    """Each test's timeout as pytest-timeout will apply it (its marker, else the configured default)."""
    code = (
        "import sys, pytest\n"
        "class Read:\n"
        "    def pytest_collection_finish(self, session):\n"
        "        from pytest_timeout import _get_item_settings\n"
        "        for item in session.items:\n"
        "            print('TIMEOUT', item.nodeid, _get_item_settings(item).timeout)\n"
        f"sys.exit(pytest.main(['--collect-only', '-q', '-n', '0', '-p', 'no:cacheprovider', "
        f"'--basetemp={tmp_path / 'timeouts'}', '-m', 'long'] + sys.argv[1:], plugins=[Read()]))\n")
    out = subprocess.run([sys.executable, "-c", code, *tests], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {parts[1]: float(parts[2]) for parts in (line.split() for line in out.stdout.splitlines())
            if parts and parts[0] == "TIMEOUT"}
