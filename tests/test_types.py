"""Every member of the workspace type-checks strictly (pyproject.toml's [tool.mypy]), as installed: each
package found through the editable install under its one name, `vidjobs.<name>`."""

from __future__ import annotations

import subprocess
import sys

from tests import workspace


def test_every_member_type_checks_strictly(tmp_path):
    packages = [arg for m in workspace.members() for arg in ("-p", m.module)]
    assert len(packages) // 2 == len(workspace.members()) >= 11
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), *packages],
                            cwd=workspace.ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr


def test_the_type_check_sees_a_type_error(tmp_path):
    """The check itself: a module with a type error, placed where a member's package is, fails it."""
    package = tmp_path / "vidjobs" / "probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def half(n: int) -> int:\n    return n / 2\n")
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "-p",
                             "vidjobs.probe"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={"MYPYPATH": str(tmp_path), "PATH": ""})
    assert result.returncode == 1 and "Incompatible return value type" in result.stdout, result.stdout
