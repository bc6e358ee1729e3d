"""bench/cpu.py counts the CPU of this stack's processes only, and a service that restarts between two
snapshots is reported and its CPU kept rather than subtracted.

The "services" here are small Python processes whose command line names a service module, which is all
bench/cpu.py goes by; they burn a known amount of CPU and say how much they spent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import cpu  # noqa: E402

# Says it runs, waits for a line on stdin, then burns CPU until its own total reaches the number on that line,
# prints its total and exits; or, given the line "sleep", just sleeps.
BURNER = """
import sys, time
print("running", flush=True)
line = sys.stdin.readline().strip()
if line == "sleep":
    time.sleep(60)
else:
    target = float(line)
    while time.process_time() < target:
        pass
    print(time.process_time(), flush=True)
"""


def _start(module: str) -> subprocess.Popen[str]:
    """A burner whose command line names `module`, once it runs: until the child has executed Python, its
    command line is still this process's, and a snapshot taken then would not know it for a service."""
    proc = subprocess.Popen([sys.executable, "-c", BURNER, module], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
    return proc


def _own_cpu(proc: subprocess.Popen[str]) -> float:
    times = psutil.Process(proc.pid).cpu_times()
    return times.user + times.system


def test_a_service_of_another_stack_is_not_counted(tmp_path: Path):
    # Started through a shell that exits at once, so it is nobody's child here: another stack's gateway.
    out = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'import time; time.sleep(60)' vidjobs.gateway "
                                      ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    stranger = int(out.stdout.strip())
    try:
        assert "vidjobs.gateway" in psutil.Process(stranger).cmdline()
        snap = cpu.snapshot(tmp_path)
        assert "gateway" not in snap.seconds, snap
    finally:
        os.kill(stranger, signal.SIGKILL)


def test_a_service_that_restarts_between_snapshots_is_reported_and_its_cpu_kept(tmp_path: Path):
    old = _start("vidjobs.media")
    try:
        before = cpu.snapshot(tmp_path)
        (old_before,) = [m.seconds for m in before.members.values() if m.pid == old.pid]
        # It burns 0.3 s more after the first snapshot, exits and is reaped; a new one takes its place.
        out, _ = old.communicate(f"{old_before + 0.3}\n", timeout=30)
        old_total = float(out)
        new = _start("vidjobs.media")
        assert new.stdin is not None
        new.stdin.write("sleep\n")
        new.stdin.flush()
        try:
            after = cpu.snapshot(tmp_path)
            new_total = _own_cpu(new)
            usage = cpu.usage(before, after)
        finally:
            new.kill()
            new.wait()
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
    # What the old process spent after the first snapshot, and everything the new one spent. The kernel
    # counts in ticks of 10 ms, and the old one's total is read at a slightly different moment than its
    # exit: a few ticks either way.
    expected = old_total - old_before + new_total
    assert abs(usage.seconds["media"] - expected) < 0.05, (usage, expected)
    assert any(str(old.pid) in note and str(new.pid) in note and "media" in note for note in usage.notes), usage
