"""What each workspace member ships and what installing one service brings along.

Every member builds a wheel holding its own module and nothing else: `vidjobs/<name>/` (the client's
`vidjobs_client/`), no top-level `libs`, `services` or `cli`, and no `vidjobs/__init__.py` (a namespace package
that every member shares, so none may own it), with the files it reads at run time. A service installed alone
from uv.lock, as deploy/Dockerfile installs it into its image, brings only the members it declares: no fake
provider and no `vidjobs` command anywhere, and PyAV only in media."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import workspace
from tests.workspace import ROOT, Member, member, members

SERVICES = ["gateway", "submitter", "poller", "media", "reaper"]
UV = Path(sys.executable).parent / "uv"
# What the services read at run time, besides their Python files: these travel in the wheels too.
DATA = {"vidjobs-common": ["migrations/0001_initial.sql"], "vidjobs-providers": ["models/replicate.toml"],
        "vidjobs-gateway": ["page/index.html", "page/app.js", "page/style.css"]}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every member's wheel, built by its own backend (uv_build) from the sources as they are."""
    out = tmp_path_factory.mktemp("wheels")
    built = subprocess.run([str(UV), "build", "--all-packages", "--wheel", "-q", "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    return out


def wheel_of(wheels: Path, distribution: str) -> zipfile.ZipFile:
    (path,) = wheels.glob(f"{distribution.replace('-', '_')}-*.whl")
    return zipfile.ZipFile(path)


def shipped(source: Member) -> set[str]:
    """The files of a member's module folder, as paths inside a wheel."""
    base = ROOT / source.folder / source.root
    return {path.relative_to(base).as_posix() for path in source.source.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


@pytest.mark.parametrize("distribution", [m.distribution for m in members()])
def test_each_member_ships_its_own_module_whole_and_nothing_else(wheels: Path, distribution: str) -> None:
    source = member(distribution)
    with wheel_of(wheels, distribution) as archive:
        files = {name for name in archive.namelist() if ".dist-info/" not in name and not name.endswith("/")}
    prefix = source.module.replace(".", "/") + "/"
    assert all(name.startswith(prefix) for name in files), sorted(n for n in files if not n.startswith(prefix))
    assert "vidjobs/__init__.py" not in files
    assert files == shipped(source), (sorted(shipped(source) - files), sorted(files - shipped(source)))
    assert prefix + "py.typed" in files
    for needed in DATA.get(distribution, []):
        assert prefix + needed in files, needed


def test_the_migrations_travel_with_common_and_the_command_with_the_cli(wheels: Path) -> None:
    with wheel_of(wheels, "vidjobs-common") as archive:
        sql = [n for n in archive.namelist() if n.startswith("vidjobs/common/migrations/") and n.endswith(".sql")]
    assert len(sql) == len(list((member("vidjobs.common").source / "migrations").glob("*.sql"))) > 0
    with wheel_of(wheels, "vidjobs-cli") as archive:
        entry_points = archive.read(next(n for n in archive.namelist() if n.endswith("entry_points.txt"))).decode()
    assert "vidjobs = vidjobs.cli.__main__:main" in entry_points


def installed_alone(distribution: str, env: Path) -> subprocess.CompletedProcess[str]:
    """Install one member and its dependencies, non-editable, from uv.lock, into a fresh environment: what
    deploy/Dockerfile does. The members are rebuilt from the sources as they are: uv's cache keys a local
    project's build on its pyproject.toml, so a module added since would otherwise be missing."""
    rebuild = [flag for m in members() for flag in ("--refresh-package", m.distribution)]
    return subprocess.run(
        [str(UV), "sync", "--frozen", "--package", distribution, "--no-dev", "--no-editable", "--quiet",
         "--python", sys.executable, *rebuild],
        cwd=ROOT, env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(env)}, capture_output=True, text=True, timeout=300)


# Run inside the installed environment, isolated (-I: no current directory, no PYTHONPATH), so nothing is found
# in the source tree: imports the service's entry point and says which of the watched packages can be found.
PROBE = """
import importlib, importlib.util, json, sys
import {entry}
watched = ["av", "vidjobs.fakeprovider", "vidjobs.cli", "vidjobs_client", "pgserver", "pytest", "vidjobs.common",
           "vidjobs.providers", "vidjobs.storage", "vidjobs.gateway", "vidjobs.submitter", "vidjobs.poller",
           "vidjobs.media", "vidjobs.reaper"]
print(json.dumps({{"found": [n for n in watched if importlib.util.find_spec(n) is not None],
                  "entry": sys.modules["{entry}"].__file__}}))
"""


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_installed_alone_holds_only_what_it_declares(tmp_path: Path, service: str) -> None:
    env = tmp_path / "env"
    installed = installed_alone(f"vidjobs-{service}", env)
    assert installed.returncode == 0, installed.stderr
    entry = "vidjobs.gateway.app" if service == "gateway" else f"vidjobs.{service}.__main__"

    probe = subprocess.run([str(env / "bin" / "python"), "-I", "-c", PROBE.format(entry=entry)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)

    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout)
    assert Path(result["entry"]).is_relative_to(env), result["entry"]  # installed, not the source tree
    found = set(result["found"])
    expected = {member(name).module for name in workspace.closure(f"vidjobs-{service}")}
    assert {name for name in found if name.startswith("vidjobs")} == expected
    assert not found & {"vidjobs.fakeprovider", "vidjobs.cli", "pgserver", "pytest"}, found
    assert ("av" in found) == (service == "media"), found


def test_the_migration_module_runs_in_the_gateway_alone(tmp_path: Path) -> None:
    """The migrations Job runs `python -m vidjobs.common.migrate` from the gateway's image."""
    env = tmp_path / "env"
    assert installed_alone("vidjobs-gateway", env).returncode == 0
    helped = subprocess.run([str(env / "bin" / "python"), "-I", "-m", "vidjobs.common.migrate", "--help"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--check" in helped.stdout, helped.stderr
    unset = subprocess.run([str(env / "bin" / "python"), "-I", "-m", "vidjobs.common.migrate", "--check"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")})
    assert unset.returncode == 2 and "VIDJOBS_DATABASE_URL" in unset.stderr, unset.stderr


DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    joined = text.replace("\\\n", " ")
    return [" ".join(line.split()) for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_dockerfile_installs_exactly_one_member_from_the_lock() -> None:
    """Docker does not run here, so the shape is checked: one install, `uv sync` of `vidjobs-$SERVICE` from
    uv.lock (--frozen), no dev group, no extra, not editable, wheels only; no other installer of the project."""
    steps = instructions(DOCKERFILE)
    installs = [s for s in steps if s.startswith("RUN") and ("uv sync" in s or "uv pip" in s or "pip install ." in s)]
    assert installs == ['RUN uv sync --frozen --package "vidjobs-${SERVICE}" --no-dev --no-editable --no-build '
                        '--python /usr/local/bin/python'], installs
    assert not any(flag in installs[0] for flag in ("--group", "--extra", "--all-packages", "--all-extras"))
    assert "COPY pyproject.toml uv.lock ./" in steps
    assert sum(s.startswith("ARG SERVICE") for s in steps) == 2  # the build stage and the runtime's label
    assert "ARG SERVICE=" not in DOCKERFILE  # no default: a build that names no service fails at once
    assert "UV_PROJECT_ENVIRONMENT=/opt/vidjobs" in DOCKERFILE
    assert "COPY --from=build /opt/vidjobs /opt/vidjobs" in steps
