"""The workspace's own sources compiled to bytecode once, before any test starts a process.

The suite starts thousands of Python processes (each stack's six services, every CLI call, the workers of
the fault runs). Where bytecode is not written (PYTHONDONTWRITEBYTECODE, as on the machines CI runs on), each
of them compiled every module it imports from source: a gateway's imports took 0.9-1.4 s of CPU that way and
0.4 s compiled, and tests/test_lifecycle.py 38 s of CPU rather than 24. The installed packages are compiled
when they are installed (the README's command passes `uv sync --compile-bytecode`); the workspace's members
are installed editable, so their sources are compiled here. compileall skips what is already current, so a
second run costs a stat per file.
"""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("libs", "services", "cli", "clients/python", "tests", "bench")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not sys.flags.dont_write_bytecode:
        return  # once, in the run's own process; where bytecode is written, each import writes its own
    for source in SOURCES:
        compileall.compile_dir(ROOT / source, quiet=1, workers=0)
