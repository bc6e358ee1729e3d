"""A module's name says one thing across the whole workspace: a reader who meets `limits` or `metrics` in a
traceback knows which one it is. Only the names every package has by convention repeat."""

from __future__ import annotations

from collections import defaultdict

from tests import workspace

# Each service's `python -m` entry, its consumer loop, and a package's Protocol with its types.
CONVENTIONAL = {"__init__", "__main__", "worker", "base"}


def _repeated(names: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: sorted(paths) for name, paths in names.items() if len(paths) > 1 and name not in CONVENTIONAL}


def test_module_names_are_unique_across_the_workspace():
    names: dict[str, list[str]] = defaultdict(list)
    for owner in workspace.members():
        if not owner.module.startswith("vidjobs."):
            continue  # the client library is published alone; its names are its own (vidjobs_client.errors)
        for path in owner.files():
            names[path.stem].append(owner.name_of(path))
    assert not _repeated(names), _repeated(names)


def test_the_name_check_sees_a_repeat():
    assert _repeated({"limits": ["vidjobs.gateway.limits", "vidjobs.submitter.limits"], "worker": ["a", "b"]}) == \
        {"limits": ["vidjobs.gateway.limits", "vidjobs.submitter.limits"]}
