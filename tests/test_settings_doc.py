"""docs/SETTINGS.md is written from `vidjobs.common.settings` and its comments; regenerate it when a setting
changes: `python -m vidjobs.common.settingsdoc > docs/SETTINGS.md`."""

from __future__ import annotations

from pathlib import Path

import msgspec

from vidjobs.common import settings
from vidjobs.common.settingsdoc import groups_of, reference

ROOT = Path(__file__).resolve().parents[1]


def test_the_settings_page_is_current():
    assert (ROOT / "docs" / "SETTINGS.md").read_text() == reference()


def test_every_setting_says_what_it_means():
    """Each field has a comment of its own, or stands under a comment block that speaks of it."""
    groups = groups_of("Settings", Path(settings.__file__).read_text())
    listed = [f.name for g in groups for f in g.fields]
    assert listed == [f.name for f in msgspec.structs.fields(settings.Settings)]
    silent = [f.name for g in groups for f in g.fields if not (f.note or g.note)]
    assert not silent, f"settings with no comment to say what they mean: {silent}"
    page = reference()
    assert all(f"`{settings.PREFIX}{name.upper()}`" in page for name in listed)


def test_a_comment_block_speaks_of_the_fields_up_to_the_next_block_or_blank_line():
    source = '''
class S:
    a: int = 1  # own
    # Block one,
    # two lines.
    b: int = 2
    c: str = "x"  # c's own
    # Block two.
    d: int = 3

    e: int = 64 * 1024  # after a blank line
'''
    groups = groups_of("S", source)
    assert [(g.note, [(f.name, f.default, f.note) for f in g.fields]) for g in groups] == [
        ("", [("a", "1", "own")]),
        ("Block one, two lines.", [("b", "2", ""), ("c", '"x"', "c's own")]),
        ("Block two.", [("d", "3", "")]),
        ("", [("e", "64 * 1024", "after a blank line")]),
    ]
