"""Rules of the code itself, checked over every module: a job status has one spelling (libs/common/states.py),
which SQL text takes through `states.sql` rather than writing the word again."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from libs.common.states import JobStatus

ROOT = Path(__file__).parents[1]
_QUOTED_STATUS = re.compile(r"'(" + "|".join(s.value for s in JobStatus) + r")'")
# webhook_deliveries has statuses of its own (pending, delivered, failed, disabled), not a job's.
_OTHER_STATUSES = {"services/gateway/appwebhooks.py"}


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
        if name in _OTHER_STATUSES:
            continue
        found += [f"{name}:{line}: {text.strip()[:80]}" for line, text in _strings(path) if _QUOTED_STATUS.search(text)]
    assert not found, "write statuses with libs.common.states.sql():\n" + "\n".join(found)
