"""vidjobs.common's modules import one another in one direction only: no two of them reach each other, directly
or through others. In particular the job row (`jobs`) is below every module that writes a job (`creation`,
`transitions`, `deletion`, `waiting`, `credits`, ...), and `transitions` calls into those, never they into it,
but for the two that end a job through it (`cancels`, and `deletion` by way of a cancel)."""

from __future__ import annotations

import ast

from tests import workspace

COMMON = "vidjobs.common"


def _common_imports(tree: ast.AST) -> set[str]:
    """The vidjobs.common modules a module imports, by their name inside the package."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == COMMON:
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(COMMON + "."):
            found.add((node.module or "").split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[2] for alias in node.names if alias.name.startswith(COMMON + ".")}
    return found


def _graph() -> dict[str, set[str]]:
    owner = workspace.member(COMMON)
    graph = {}
    for path in owner.files():
        name = owner.name_of(path)
        if name.count(".") == 2:  # the package's own modules (its migrations folder holds no code)
            graph[name.split(".")[2]] = _common_imports(ast.parse(path.read_text()))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle a depth-first walk meets, each as the path that closes it."""
    found: list[list[str]] = []
    state: dict[str, str] = {}
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                walk(target)
        path.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return found


def test_the_cycle_check_finds_a_planted_cycle():
    planted = {"transitions": {"jobs", "credits"}, "jobs": {"states"}, "credits": {"transitions"}, "states": set()}
    assert cycles(planted) == [["credits", "transitions", "credits"]]
    assert cycles({**planted, "credits": {"jobs"}}) == []


def test_common_modules_import_each_other_in_one_direction():
    graph = _graph()
    assert {"jobs", "transitions", "creation", "deletion", "waiting", "credits"} <= graph.keys()
    assert not cycles(graph), "\n".join(" -> ".join(cycle) for cycle in cycles(graph))


def test_the_job_row_is_below_what_writes_jobs():
    graph = _graph()
    # The row reads: it knows the statuses, the error type and the stop message, and nothing that writes.
    assert graph["jobs"] <= {"errors", "events", "states"}, graph["jobs"]
    writers = {"creation", "waiting", "credits", "recovery_checks", "provider_reports", "attempt_costs"}
    assert not {name for name in writers if "transitions" in graph[name]}
    assert {"jobs", "credits", "waiting"} <= graph["transitions"]
    # A deleted live job is canceled first, through the transition function, never by a write of its own.
    assert "cancels" in graph["deletion"] and not graph["deletion"] & {"credits", "waiting"}
