"""Which tables and views a service's code touches, and how, read from the SQL in its source.

A service's code is its own package plus every `libs` module it imports, followed through the imports: the
transition guard, the outbox and the credit code run inside every service. The SQL is every string literal
(and the literal parts of f-strings) that reads like a statement. From each one:

- `INSERT INTO t` needs INSERT; `UPDATE t` needs UPDATE; `DELETE FROM t` needs DELETE;
- `FROM t` or `JOIN t` (a read, or a source of an UPDATE or INSERT ... SELECT) needs SELECT;
- a WHERE or RETURNING on an UPDATE or DELETE, and RETURNING or ON CONFLICT DO UPDATE on an INSERT, read
  the target too (SELECT); ON CONFLICT DO UPDATE also updates it;
- `FOR UPDATE` / `FOR SHARE` locks need UPDATE on the tables read;
- `f(` for a function the migrations create needs EXECUTE on it.

Where a table is granted by column, `named_columns` lists the columns a service's SQL names through the
table or its alias (`a.concurrent_jobs`), and `*` where it reads them all. A column named bare is not seen:
the lifecycle test, with every service on its own role, is what catches that.

It over-approximates: a module imported for one function brings all its statements. A reachable statement
the service never runs is listed, with the reason, by the test that compares this with the grants.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import workspace
from vidjobs.common.grants import Privilege

ROOT = Path(__file__).resolve().parents[1]

_VERB = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b")
_INSERT = re.compile(r"INSERT INTO (\w+)")
_UPDATE = re.compile(r"(?<!FOR )(?<!DO )(?<!KEY )\bUPDATE (\w+)")
_DELETE = re.compile(r"DELETE FROM (\w+)")
_READ = re.compile(r"(?<!DELETE )\b(?:FROM|JOIN) (\w+)")
_LOCK = re.compile(r"FOR (?:NO KEY )?UPDATE|FOR (?:KEY )?SHARE")

Uses = dict[str, set[Privilege]]


def _migrations() -> list[str]:
    return [sql.read_text() for sql in sorted(workspace.migrations_folder().glob("*.sql"))]


def schema_tables() -> set[str]:
    found = {"schema_migrations"}  # made by db.migrate itself
    for sql in _migrations():
        found |= set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", sql))
    return found


def schema_views() -> set[str]:
    return {name for sql in _migrations() for name in re.findall(r"CREATE (?:OR REPLACE )?VIEW (\w+)", sql)}


def schema_functions() -> set[str]:
    return {name for sql in _migrations() for name in re.findall(r"CREATE (?:OR REPLACE )?FUNCTION (\w+)", sql)}


# A service's code: its own package and the libraries (never another service, never the fake provider).
_LIBS = ("vidjobs.common.", "vidjobs.providers.", "vidjobs.storage.")


def _path(module: str) -> Path | None:
    return workspace.path_of(module)


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if _path(name)}


def modules_of(service: str) -> set[str]:
    """The service's own modules and every libs module they reach; never another service's."""
    todo = [f"vidjobs.{service}.{p.stem}" for p in workspace.member(f"vidjobs.{service}").source.glob("*.py")]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _path(module)
        assert path is not None, module
        todo += [m for m in _imports(module, path) if m.startswith((*_LIBS, f"vidjobs.{service}."))]
    return seen


def _literals(path: Path) -> list[str]:
    texts = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            texts.append("".join(v.value if isinstance(v, ast.Constant) else " ? " for v in node.values))
    return [" ".join(t.split()) for t in texts if _VERB.search(t)]


def statement_uses(sql: str, tables: set[str], functions: set[str] = frozenset()) -> Uses:
    uses: Uses = {}

    def add(names: list[str], *privileges: Privilege) -> None:
        for name in names:
            if name in tables:
                uses.setdefault(name, set()).update(privileges)

    inserted, updated, deleted = _INSERT.findall(sql), _UPDATE.findall(sql), _DELETE.findall(sql)
    read = _READ.findall(sql)
    add(inserted, Privilege.INSERT)
    add(updated, Privilege.UPDATE)
    add(deleted, Privilege.DELETE)
    add(read, Privilege.SELECT)
    if " WHERE " in sql or "RETURNING" in sql:
        add(updated + deleted, Privilege.SELECT)
    if "RETURNING" in sql:
        add(inserted, Privilege.SELECT)
    if "DO UPDATE" in sql:
        add(inserted, Privilege.UPDATE, Privilege.SELECT)
    if _LOCK.search(sql):
        add(read + updated, Privilege.UPDATE)
    for name in functions:
        if re.search(rf"\b{name}\(", sql):
            uses[name] = {Privilege.EXECUTE}
    return uses


_NOT_ALIAS = {"WHERE", "ON", "JOIN", "LEFT", "RIGHT", "INNER", "CROSS", "FULL", "ORDER", "GROUP", "LIMIT", "FOR",
              "SET", "USING", "RETURNING", "UNION", "WINDOW", "HAVING", "OFFSET"}


def statement_columns(sql: str, table: str) -> set[str]:
    """The columns of `table` a statement names through the table or its alias; `*` where it takes all."""
    if not re.search(rf"\b(?:FROM|JOIN|UPDATE|INTO) {table}\b", sql):
        return set()
    aliases = {table} | {a for a in re.findall(rf"\b(?:FROM|JOIN|UPDATE) {table}(?: AS)? (\w+)", sql)
                         if a.upper() not in _NOT_ALIAS}
    found = set()
    for alias in aliases:
        found |= set(re.findall(rf"(?<![\w.]){alias}\.(\w+|\*)", sql))
    if re.search(r"(?:SELECT|RETURNING) \*", sql):
        found.add("*")
    return found


def uses_of(service: str) -> dict[str, dict[Privilege, set[str]]]:
    """table or view → privilege → the files whose SQL needs it."""
    tables, functions = schema_tables() | schema_views(), schema_functions()
    found: dict[str, dict[Privilege, set[str]]] = {}
    for module in sorted(modules_of(service)):
        path = _path(module)
        assert path is not None
        for sql in _literals(path):
            for table, privileges in statement_uses(sql, tables, functions).items():
                for privilege in privileges:
                    found.setdefault(table, {}).setdefault(privilege, set()).add(path.relative_to(ROOT).as_posix())
    return found


def named_columns(service: str, table: str) -> dict[str, set[str]]:
    """column (or `*`) of `table` -> the files whose SQL names it, for the service's code."""
    found: dict[str, set[str]] = {}
    for module in sorted(modules_of(service)):
        path = _path(module)
        assert path is not None
        for sql in _literals(path):
            for column in statement_columns(sql, table):
                found.setdefault(column, set()).add(path.relative_to(ROOT).as_posix())
    return found
