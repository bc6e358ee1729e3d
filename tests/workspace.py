"""The workspace's own map, read from the root pyproject.toml and each member's: which distribution lives in
which folder, the module it installs, where that module's source is and what it declares it depends on. The
import rules, the SQL scan, the type check and the packaging tests all read it here, so the map is written
once, in the files the installer itself reads."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Member:
    distribution: str  # vidjobs-gateway
    folder: str  # services/gateway, relative to the root
    module: str  # vidjobs.gateway
    requires: frozenset[str]  # the distributions it declares, by name (vidjobs-common, aiohttp, ...)

    @property
    def source(self) -> Path:
        """The module's own folder: src/vidjobs/gateway, or the client's vidjobs_client."""
        return ROOT / self.folder / self.root / self.module.replace(".", "/")

    @property
    def root(self) -> str:
        backend = _pyproject(self.folder)["tool"]["uv"]["build-backend"]
        return str(backend.get("module-root", "src"))

    def files(self) -> list[Path]:
        return sorted(self.source.rglob("*.py"))

    def name_of(self, path: Path) -> str:
        """The dotted module name of one of its files."""
        relative = path.resolve().relative_to(ROOT / self.folder / self.root).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        return ".".join(parts)


def _pyproject(folder: str) -> dict:
    return tomllib.loads((ROOT / folder / "pyproject.toml").read_text())


def _requirement_name(spec: str) -> str:
    return re.split(r"[\[=<>!~; ]", spec, maxsplit=1)[0].lower().replace("_", "-")


@cache
def members() -> tuple[Member, ...]:
    found = []
    for folder in _pyproject(".")["tool"]["uv"]["workspace"]["members"]:
        project = _pyproject(folder)
        module = project["tool"]["uv"]["build-backend"]["module-name"]
        requires = frozenset(_requirement_name(spec) for spec in project["project"].get("dependencies", []))
        found.append(Member(project["project"]["name"], folder, module, requires))
    return tuple(found)


def member(module_or_distribution: str) -> Member:
    return next(m for m in members() if module_or_distribution in (m.module, m.distribution))


def member_of(module: str) -> Member | None:
    """The member whose module is `module` or holds it."""
    return next((m for m in members() if module == m.module or module.startswith(m.module + ".")), None)


def path_of(module: str) -> Path | None:
    owner = member_of(module)
    if owner is None:
        return None
    base = owner.source / module[len(owner.module):].lstrip(".").replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def migrations_folder() -> Path:
    return member("vidjobs.common").source / "migrations"


def closure(distribution: str) -> set[str]:
    """The members an install of `distribution` holds: it and every member it requires, transitively."""
    found: set[str] = set()
    todo = [distribution]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += [r for r in member(name).requires if r.startswith("vidjobs-")]
    return found
