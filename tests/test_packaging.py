"""What `pip install .` puts into site-packages: one import root, `vidjobs`, and the `vidjobs` command; no
top-level `libs`, `services` or `cli` that another distribution could overwrite (or be overwritten by)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_distribution_installs_only_the_vidjobs_package_and_command(tmp_path):
    # From a copy: a build leaves build/ beside the sources, and an old one's files would ride along.
    source = shutil.copytree(ROOT, tmp_path / "source", ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".*_cache", ".vidjobs", "tests", "bench", "docs"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("vidjobs-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"vidjobs"}
    assert "vidjobs = vidjobs.cli.__main__:main" in entry_points
    # What the services read at run time travels with them.
    for needed in ("vidjobs/common/migrations/0001_initial.sql", "vidjobs/gateway/page/index.html",
                   "vidjobs/client/py.typed", "vidjobs/providers/fake/server.py", "vidjobs/gateway/__main__.py"):
        assert needed in names, needed
