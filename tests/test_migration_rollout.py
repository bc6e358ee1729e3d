"""Every migration says whether the release before it can run beside it (docs/UPGRADES.md).

The first line of each file is `-- rollout: KIND: why`. `expand` adds only what the previous release can
ignore; `contract` removes, renames or narrows something that release still uses, and also carries a
`-- split:` line saying which earlier `expand` migration its release stopped using the old shape in (for
0013 and 0014, applied before the rule, what that split would have been). db.migrate records a migration
by its number alone, so the header lines added to applied files change nothing a database holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import workspace

KINDS = ("first", "expand", "contract")
HEADER = re.compile(r"-- rollout: (?P<kind>\w+): (?P<why>\S.*)")
# Contract migrations written before the rule: their split line says what the split would have been.
BEFORE_THE_RULE = {13, 14}


def _files() -> list[Path]:
    return sorted(workspace.migrations_folder().glob("*.sql"))


def _number(path: Path) -> int:
    return int(path.name.split("_", 1)[0])


def rollout_of(text: str) -> tuple[str, str | None]:
    """The migration's declared kind and its split line (None without one); ValueError without a header."""
    lines = text.splitlines()
    found = HEADER.fullmatch(lines[0]) if lines else None
    if found is None or found["kind"] not in KINDS:
        raise ValueError(f"the first line must be `-- rollout: <{'|'.join(KINDS)}>: <why>`, not {lines[:1]}")
    split = next((line.removeprefix("-- split: ") for line in lines[:8] if line.startswith("-- split: ")), None)
    return found["kind"], split


def test_the_migrations_are_there():
    assert len(_files()) >= 20


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_each_migration_declares_its_rollout(path: Path):
    kind, split = rollout_of(path.read_text())
    assert (kind == "first") == (_number(path) == 1), f"{path.name}: only 0001 has no release before it"
    if kind == "contract":
        assert split, f"{path.name}: a contract migration says, on a `-- split:` line, how it is split"


def test_a_new_contract_names_the_expand_migration_it_follows():
    """Only a migration after the rule: it must name (as NNNN) an earlier expand migration, whose release
    stopped using what this one removes."""
    kinds = {_number(p): rollout_of(p.read_text()) for p in _files()}
    for number, (kind, split) in kinds.items():
        if kind != "contract" or number in BEFORE_THE_RULE:
            continue
        named = [int(n) for n in re.findall(r"\b(\d{4})\b", split or "")]
        earlier = [n for n in named if n < number and kinds.get(n, ("", None))[0] == "expand"]
        assert earlier, f"{number:04d}: the split line names no earlier expand migration (found {named})"


def test_the_header_check_refuses_a_migration_without_one():
    with pytest.raises(ValueError, match="rollout"):
        rollout_of("-- A new table.\nCREATE TABLE t (id int);\n")
    with pytest.raises(ValueError, match="rollout"):
        rollout_of("-- rollout: maybe: it depends.\n")
    assert rollout_of("-- rollout: contract: drops t.\n-- split: expand 0021.\n") == ("contract", "expand 0021.")
