"""Every migration says whether the release before it can run beside it (docs/UPGRADES.md), in a header
tests/migrationkinds.py reads: `-- rollout: KIND: why`, and for a contract a `-- split:` line. 0013 and 0014,
applied before the rule, say on it what their split would have been. db.migrate records a migration by its
number alone, so the header lines added to applied files change nothing a database holds.

The kind is enforced twice: here, every file must declare one; and tests/test_mixed_fleet.py refuses to roll
out beside the previous release a contract migration that release still needs (`rollout_refusals`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import workspace
from tests.migrationkinds import BEFORE_THE_RULE, Migration, contracts_the_previous_release_needs, read, rollout_of


def _files() -> list[Path]:
    return sorted(workspace.migrations_folder().glob("*.sql"))


def _number(path: Path) -> int:
    return int(path.name.split("_", 1)[0])


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
    kinds = read(workspace.migrations_folder())
    for number, migration in kinds.items():
        if migration.kind != "contract" or number in BEFORE_THE_RULE:
            continue
        earlier = [n for n in migration.split_names if n < number and n in kinds and kinds[n].kind == "expand"]
        assert earlier, f"{number:04d}: the split line names no earlier expand migration ({migration.split_names})"


def test_the_header_check_refuses_a_migration_without_one():
    with pytest.raises(ValueError, match="rollout"):
        rollout_of("-- A new table.\nCREATE TABLE t (id int);\n")
    with pytest.raises(ValueError, match="rollout"):
        rollout_of("-- rollout: maybe: it depends.\n")
    assert rollout_of("-- rollout: contract: drops t.\n-- split: expand 0021.\n") == ("contract", "expand 0021.")


def test_a_migration_folder_with_a_file_lacking_its_header_is_refused(tmp_path: Path):
    (tmp_path / "0001_initial.sql").write_text("-- rollout: first: the first schema.\nCREATE TABLE t (id int);\n")
    (tmp_path / "0002_more.sql").write_text("-- More.\nALTER TABLE t ADD COLUMN n int;\n")
    with pytest.raises(ValueError, match="rollout"):
        read(tmp_path)


def test_a_contract_is_refused_beside_a_release_that_still_uses_what_it_removes():
    current = {
        20: Migration(20, "expand", None),
        27: Migration(27, "expand", None),  # release N: a new column, the old one no longer read
        28: Migration(28, "contract", "expand = 0027; contract = this, dropping the old column"),
    }
    # The previous release has 0020 only: it still reads the old column, so 0028 cannot roll out beside it.
    refused = contracts_the_previous_release_needs({20}, current)
    assert len(refused) == 1 and refused[0].startswith("0028 is a contract migration"), refused
    # The previous release is N (it has 0027, and stopped using the old shape): the contract may follow it.
    assert contracts_the_previous_release_needs({20, 27}, current) == []
    # Expand migrations alone never stop a rollout, and a contract the previous release already has is past.
    assert contracts_the_previous_release_needs({20}, {20: current[20], 27: current[27]}) == []
    assert contracts_the_previous_release_needs({20, 27, 28}, current) == []

