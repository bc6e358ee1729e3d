"""Rules of the code itself, checked over every module: a job status has one spelling (libs/common/states.py),
which SQL text takes through `states.sql` rather than writing the word again."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from vidjobs.common.states import JobStatus

ROOT = Path(__file__).parents[1]
_QUOTED_STATUS = re.compile(r"'(" + "|".join(s.value for s in JobStatus) + r")'")
# webhook_deliveries has statuses of its own (pending, delivered, failed, disabled), not a job's.
_OTHER_STATUSES = "services/gateway/appwebhooks/"


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_sql_never_spells_a_job_status():
    found = []
    for path in sorted([*ROOT.glob("libs/**/*.py"), *ROOT.glob("services/**/*.py"), *ROOT.glob("cli/**/*.py")]):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(_OTHER_STATUSES):
            continue
        found += [f"{name}:{line}: {text.strip()[:80]}" for line, text in _strings(path) if _QUOTED_STATUS.search(text)]
    assert not found, "write statuses with vidjobs.common.states.sql():\n" + "\n".join(found)


# Where each importable package's code lives: the import rules are about these folders.
FOLDERS = {
    "vidjobs.gateway": "services/gateway", "vidjobs.submitter": "services/submitter",
    "vidjobs.poller": "services/poller", "vidjobs.media": "services/media", "vidjobs.reaper": "services/reaper",
    "vidjobs.common": "libs/common", "vidjobs.providers": "libs/providers", "vidjobs.storage": "libs/storage",
    "vidjobs.cli": "cli",
}
SERVICES = {folder for folder in FOLDERS.values() if folder.startswith("services/")}


def _folder_of(module: str) -> str | None:
    for package, folder in FOLDERS.items():
        if module == package or module.startswith(package + "."):
            return folder
    return None


def _imported(path: Path) -> set[str]:
    """The folders whose code a module imports (absolute and relative imports, at any depth)."""
    rel = path.relative_to(ROOT).as_posix()
    package, folder = next((pkg, folder) for pkg, folder in FOLDERS.items() if rel.startswith(folder + "/"))
    package = ".".join([package, *Path(rel[len(folder) + 1:]).parts[:-1]])
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
    return {folder for name in names if (folder := _folder_of(name))}


def _breaks(folder: str, imported: str) -> str | None:
    if folder in SERVICES and imported in SERVICES and imported != folder:
        return "a service never imports another service"
    if folder.startswith("libs/") and imported in SERVICES:
        return "libs/ never imports a service"
    if {folder, imported} == {"libs/providers", "libs/storage"}:
        return "providers and storage do not import each other"
    return None


def test_the_import_rules_of_the_design_hold():
    broken = []
    for folder in set(FOLDERS.values()):
        for path in sorted((ROOT / folder).rglob("*.py")):
            broken += [f"{path.relative_to(ROOT)} imports {imported}: {why}" for imported in sorted(_imported(path))
                       if (why := _breaks(folder, imported))]
    assert not broken, "\n".join(broken)


def test_the_import_rules_see_a_broken_rule():
    """The check itself: a module that broke each rule would be caught (no test that cannot fail)."""
    assert _breaks("services/media", "services/gateway") and _breaks("libs/common", "services/reaper")
    assert _breaks("libs/storage", "libs/providers") and not _breaks("cli", "services/gateway")
    assert _folder_of("vidjobs.gateway.routes_jobs") == "services/gateway" and _folder_of("msgspec") is None
