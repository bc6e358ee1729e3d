"""Each migration's rollout kind, read from its header (docs/UPGRADES.md "Migrations: expand and contract"),
and the rule a rolling upgrade holds them to.

The first line of each file is `-- rollout: KIND: why`. `expand` adds only what the previous release can
ignore; `contract` removes, renames or narrows something, and carries a `-- split:` line naming (as NNNN)
the earlier `expand` migration whose release stopped using the old shape. A release may roll out beside the
one before it only if every contract migration it adds names an expand migration that release already has:
otherwise the old pods still use what the contract removes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KINDS = ("first", "expand", "contract")
HEADER = re.compile(r"-- rollout: (?P<kind>\w+): (?P<why>\S.*)")
# Contract migrations written before the rule, applied long before the first release: their split line says
# what the split would have been, and names no migration.
BEFORE_THE_RULE = {13, 14}
_FILE = re.compile(r"(\d{4})_\w+\.sql")


@dataclass(frozen=True)
class Migration:
    number: int
    kind: str
    split: str | None  # the `-- split:` line, for a contract

    @property
    def split_names(self) -> list[int]:
        """The migrations the split line names, as NNNN."""
        return [int(n) for n in re.findall(r"\b(\d{4})\b", self.split or "")]


def rollout_of(text: str) -> tuple[str, str | None]:
    """The migration's declared kind and its split line (None without one); ValueError without a header."""
    lines = text.splitlines()
    found = HEADER.fullmatch(lines[0]) if lines else None
    if found is None or found["kind"] not in KINDS:
        raise ValueError(f"the first line must be `-- rollout: <{'|'.join(KINDS)}>: <why>`, not {lines[:1]}")
    split = next((line.removeprefix("-- split: ") for line in lines[:8] if line.startswith("-- split: ")), None)
    return found["kind"], split


def numbers_in(tree: Path) -> set[int]:
    """The migration numbers a source tree holds, wherever its layout kept them (`**/migrations/NNNN_*.sql`)."""
    return {int(m[1]) for p in tree.glob("**/migrations/*.sql") if (m := _FILE.fullmatch(p.name))}


def read(folder: Path) -> dict[int, Migration]:
    """This checkout's migrations with their declared kinds."""
    found = {}
    for path in sorted(folder.glob("*.sql")):
        kind, split = rollout_of(path.read_text())
        number = int(path.name.split("_", 1)[0])
        found[number] = Migration(number, kind, split)
    return found


def contracts_the_previous_release_needs(previous: set[int], current: dict[int, Migration]) -> list[str]:
    """Why this release cannot roll out beside the previous one (which has the migrations `previous`): each
    contract migration added since that does not name, on its split line, an expand migration the previous
    release already has. Empty when the rollout is safe."""
    refused = []
    for number, migration in sorted(current.items()):
        if number in previous or migration.kind != "contract":
            continue
        stopped_using = [n for n in migration.split_names
                         if n in previous and n in current and current[n].kind == "expand"]
        if not stopped_using:
            refused.append(f"{number:04d} is a contract migration whose split line names no expand migration the "
                           f"previous release has (it names {migration.split_names}): that release still uses "
                           "what it removes; ship the expand half in one release and the contract in the next")
    return refused
